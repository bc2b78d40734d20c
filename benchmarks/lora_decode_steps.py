"""Multi-LoRA decode steps on the CPU (issue 50): the model's layers per decode step, in the
fused decode stack (``octavo_decode_layers``, which adds the adapters' deltas in its call)
against the same steps layer by layer (the stack and the per-layer fused call switched off,
as tests/core/lora/test_lora_fast_paths.py does), and the base model's fused steps, in one
process and one engine, the modes taking turns for ``--rounds`` rounds.

Why: ``lora_throughput.py`` compares two engines run one after the other, whose ratio swings
with the machine's load; here each decode step of ``--requests`` rows is timed (``run_layers``)
in every mode under the same load, and the least and the 20th percentile are printed:

    python benchmarks/lora_decode_steps.py --requests 16 --output-len 32 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lora_throughput import write_adapters

from octavo import LLM, LoRARequest
from octavo.bench.datasets import workload_requests
from octavo.bench.offline import fixed_length_params, warm_up
from octavo.cpu import decode_layer
from octavo.models.loader import load_model_files

MODES = ("fused", "layer by layer", "base model, fused")


class StepClock:
    """The wall time of each ``run_layers`` call over ``rows`` rows (a decode step of every
    request), recorded while installed."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.times: list[float] = []
        self.run_layers = decode_layer.CpuLlamaModel.run_layers

    def __enter__(self) -> StepClock:
        run_layers, times, rows = self.run_layers, self.times, self.rows

        def timed(model: decode_layer.CpuLlamaModel, positions: Any, hidden: Any,
                  *args: Any) -> Any:
            start = time.perf_counter()
            result = run_layers(model, positions, hidden, *args)
            if hidden.shape[0] == rows:
                times.append(time.perf_counter() - start)
            return result

        decode_layer.CpuLlamaModel.run_layers = timed  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        decode_layer.CpuLlamaModel.run_layers = self.run_layers  # type: ignore[method-assign]


def set_mode(mode: str, fused_stack: Any, layer_weights: Any) -> None:
    """Decode steps in the fused stack, or layer by layer (no fused call at all)."""
    fused = mode != "layer by layer"
    stack = fused_stack if fused else lambda self, caches: None
    decode_layer.CpuLlamaModel._fused_stack = stack  # type: ignore[method-assign]
    decode_layer._layer_weights = layer_weights if fused else lambda layer: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    prompts = [list(r.prompt)  # type: ignore[arg-type]
               for r in workload_requests("W1_throughput")[:args.requests]]
    hf_config = load_model_files(None).hf_config
    fused_stack = decode_layer.CpuLlamaModel._fused_stack
    layer_weights = decode_layer._layer_weights
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as folder:
        adapters = write_adapters(Path(folder), hf_config, args.adapters, args.rank)
        llm = LLM(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank)
        warm_up(llm)
        for _ in range(args.rounds):
            for mode in MODES:
                set_mode(mode, fused_stack, layer_weights)
                loras: list[LoRARequest | None] = [
                    None if mode == "base model, fused" else adapters[i % len(adapters)]
                    for i in range(len(prompts))]
                with StepClock(len(prompts)) as clock:
                    llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 fixed_length_params(args.output_len), use_tqdm=False,
                                 lora_request=loras)
                times[mode] += clock.times
        set_mode("fused", fused_stack, layer_weights)
        llm.shutdown()
    print(f"decode steps of {len(prompts)} rows, {args.adapters} adapters of rank {args.rank}")
    for mode, values in times.items():
        values.sort()
        print(f"{mode:>18}: {len(values)} steps, least {1e3 * values[0]:.2f} ms, 20th "
              f"percentile {1e3 * values[len(values) // 5]:.2f} ms, median "
              f"{1e3 * statistics.median(values):.2f} ms")


if __name__ == "__main__":
    main()
