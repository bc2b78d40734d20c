"""Where one decode step's time goes (issue 51): B greedy requests of ``--context-len`` random
prompt tokens are prefilled, then ``--steps`` engine steps are timed, each phase of a step
(scheduler, input preparation, the fused C decode stack, the LM head, sampling metadata,
the sampler, output processing) by wrapping the function that does it. Medians per step.

``--clock thread`` counts the calling thread's CPU time instead of the wall clock: on a
machine other processes load, the wall clock measures mostly their share of the cores,
while the thread's CPU time still shows what each phase costs (run it with
``OMP_NUM_THREADS=1`` so the forward's work is on that thread too). ``--profile`` adds a
cProfile (on the same clock) of the timed steps, its top functions by own time.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_breakdown.py --batch-size 1 \\
        --clock thread --dtype bfloat16
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from octavo.cpu import decode_layer, kernels
from octavo.engine.llm import LLM
from octavo.engine.output_processor import OutputProcessor
from octavo.models.base import CausalLM
from octavo.sample.sampler import Sampler
from octavo.sampling_params import SamplingParams
from octavo.sched.scheduler import Scheduler
from octavo.worker import model_runner
from octavo.worker.model_runner import ModelRunner

CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}

# (owner, attribute, phase): methods are wrapped on their class, module functions where
# their caller looks them up (model_runner imported prepare_step by name).
PHASES: list[tuple[Any, str, str]] = [
    (Scheduler, "schedule", "scheduler.schedule"),
    (model_runner, "prepare_step", "prepare_step"),
    (ModelRunner, "run_model", "forward (run_model)"),
    (decode_layer, "decode_step", "  decode_step (the fused call's step)"),
    (kernels, "decode_layers", "  C decode stack (30 layers)"),
    (CausalLM, "compute_logits", "LM head (compute_logits)"),
    (ModelRunner, "sampling_metadata", "sampling_metadata"),
    (Sampler, "__call__", "sampler"),
    (ModelRunner, "execute_model", "execute_model (all of the runner)"),
    (Scheduler, "update_from_output", "scheduler.update_from_output"),
    (OutputProcessor, "process_outputs", "output_processor"),
]


def instrument(clock: Callable[[], int]) -> dict[str, list[int]]:
    """Wrap every phase's function to record its duration (ns) per call."""
    times: dict[str, list[int]] = {label: [] for _, _, label in PHASES}
    for owner, name, label in PHASES:
        setattr(owner, name, _timed(getattr(owner, name), times[label], clock))
    return times


def _timed(function: Callable[..., Any], out: list[int],
           clock: Callable[[], int]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        result = function(*args, **kwargs)
        out.append(clock() - start)
        return result
    return wrapper


def run_steps(llm: LLM, batch_size: int, context_len: int, steps: int, rng: random.Random,
              clock: Callable[[], int], times: dict[str, list[int]],
              profile: cProfile.Profile | None = None) -> list[int]:
    """Prefill a batch, clear the phases' records, then time its decode steps."""
    engine = llm.llm_engine
    vocab = len(llm.get_tokenizer())
    params = SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True)
    for _ in range(batch_size):
        engine.add_request({"prompt_token_ids": [rng.randrange(vocab)
                                                 for _ in range(context_len)]}, params)
    engine.step()  # the prefill
    for record in times.values():
        record.clear()
    step_times = []
    if profile is not None:
        profile.enable()
    while engine.has_unfinished_requests():
        start = clock()
        engine.step()
        step_times.append(clock() - start)
    if profile is not None:
        profile.disable()
    return step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--context-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantization", default=None,
                        help="gguf: the default model on its blocks (default: dense)")
    args = parser.parse_args()
    print(f"seed {args.seed}")
    clock = CLOCKS[args.clock]
    llm = LLM(dtype=args.dtype, quantization=args.quantization,
              max_num_seqs=max(args.batch_size, 8))
    times = instrument(clock)
    rng = random.Random(args.seed)
    run_steps(llm, args.batch_size, args.context_len, 20, rng, clock, times)  # warm-up
    profile = cProfile.Profile(clock, 1e-9) if args.profile else None
    steps = run_steps(llm, args.batch_size, args.context_len, args.steps, rng, clock, times,
                      profile)
    print(f"B = {args.batch_size}, {len(steps)} decode steps, {args.clock} clock, medians:")
    print(f"  {'engine step':40s} {statistics.median(steps) / 1e6:8.3f} ms")
    for label, record in times.items():
        if record:
            print(f"  {label:40s} {statistics.median(record) / 1e6:8.3f} ms")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
