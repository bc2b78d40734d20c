"""Multi-LoRA throughput on the CPU (issue 50): workload W1 with every request on one of
``--adapters`` rank-``--rank`` adapters (round-robin) against the base model alone, same
engine settings; prints both runs' output tok/s, their ratio (goal: LoRA >= 0.7x base),
the LoRA kernels' (shrink + expand) time per step where they run as calls of their own
(steps outside the fused decode stack: prompt chunks), and each run's time per step in the
fused decode stack (``octavo_decode_layers``), whose one C call adds the decode steps'
deltas itself: the LoRA run's stack time less the base run's is what those deltas cost.

The adapters are written here as PEFT folders with random A and B on every projection of
the default model (SmolLM2-135M), so nothing is downloaded. Run it on an idle machine:

    python benchmarks/lora_throughput.py --adapters 8 --rank 16 --workload W1_throughput

``--num-requests`` and ``--output-len`` shrink the workload for a quick check. Engine
keywords go in as ``--engine KEY=VALUE`` (e.g. ``--engine dtype=bfloat16``).
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from octavo import LLM, LoRARequest
from octavo.bench.datasets import workload_requests
from octavo.bench.offline import fixed_length_params, warm_up
from octavo.cpu import kernels
from octavo.cpu import lora as cpu_lora
from octavo.lora.registry import projection_shapes
from octavo.models.loader import load_model_files

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapters(folder: Path, hf_config: dict[str, Any], count: int,
                   rank: int) -> list[LoRARequest]:
    """``count`` PEFT adapters with random A and B on every projection, in ``folder``."""
    shapes = projection_shapes(hf_config)
    generator = torch.Generator().manual_seed(0)
    requests = []
    for index in range(count):
        tensors = {}
        for layer in range(int(hf_config["num_hidden_layers"])):
            for kind, (out_features, in_features) in shapes.items():
                block = "self_attn" if kind in _ATTENTION else "mlp"
                key = f"base_model.model.model.layers.{layer}.{block}.{kind}"
                tensors[f"{key}.lora_A.weight"] = 0.02 * torch.randn(
                    rank, in_features, generator=generator)
                tensors[f"{key}.lora_B.weight"] = 0.02 * torch.randn(
                    out_features, rank, generator=generator)
        path = folder / f"adapter{index}"
        path.mkdir()
        save_file(tensors, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
             "target_modules": list(shapes)}))
        requests.append(LoRARequest(f"adapter{index}", index + 1, str(path)))
    return requests


class Clock:
    """Wall time spent in the calls :meth:`timed` wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            result = kernel(*args)
            self.seconds += time.perf_counter() - start
            return result
        return call


class KernelClock(Clock):
    """Wall time spent in the engine's LoRA kernel calls (one worker in this process): each
    wrapped layer's one-call delta where the platform has one (its C function is wrapped,
    so the fused decode stack still takes the delta's operands), else its shrink/expand."""

    def __init__(self, llm: LLM) -> None:
        super().__init__()
        lora = llm.llm_engine.core.executor.worker.runner.lora
        assert lora is not None
        lora.batch.shrink = self.timed(lora.batch.shrink)
        lora.batch.expand = self.timed(lora.batch.expand)
        for layer in lora.layers:
            if isinstance(layer.delta, cpu_lora.LayerDelta):
                layer.delta.function = self.timed(layer.delta.function)


class StackClock(Clock):
    """Wall time spent in the fused decode stack's calls (``kernels.decode_layers``)."""

    def __enter__(self) -> StackClock:
        self.call = kernels.decode_layers
        kernels.decode_layers = self.timed(self.call)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        kernels.decode_layers = self.call  # type: ignore[assignment]


def run(llm: LLM, prompts: list[list[int]], output_len: int, loras: list[LoRARequest] | None,
        stack: StackClock, clock: KernelClock | None = None) -> tuple[float, int]:
    """(output tok/s, engine steps) of one timed run of every request at once."""
    warm_up(llm)
    stack.seconds = 0.0
    if clock is not None:
        clock.seconds = 0.0
    steps = [0]
    core = llm.llm_engine.core
    step = core.step

    def counted():  # type: ignore[no-untyped-def]
        steps[0] += 1
        return step()

    core.step = counted
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           fixed_length_params(output_len), use_tqdm=False,
                           lora_request=loras)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed, steps[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--workload", default="W1_throughput")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    engine: dict[str, Any] = {}
    for item in args.engine:
        key, _, value = item.partition("=")
        engine[key] = json.loads(value) if value[:1].isdigit() else value
    requests = workload_requests(args.workload)[:args.num_requests]
    output_len = args.output_len or requests[0].output_len
    prompts = [list(r.prompt) for r in requests]  # type: ignore[arg-type]
    hf_config = load_model_files(engine.get("model")).hf_config
    base, base_stack, lora_stack = LLM(**engine), StackClock(), StackClock()
    with base_stack:
        base_tps, base_steps = run(base, prompts, output_len, None, base_stack)
    base.shutdown()
    del base
    gc.collect()
    with tempfile.TemporaryDirectory() as folder:
        adapters = write_adapters(Path(folder), hf_config, args.adapters, args.rank)
        llm = LLM(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
                  **engine)
        clock = KernelClock(llm)
        loras = [adapters[i % len(adapters)] for i in range(len(prompts))]
        with lora_stack:
            lora_tps, steps = run(llm, prompts, output_len, loras, lora_stack, clock)
        llm.shutdown()
    print(f"{len(prompts)} requests x {output_len} output tokens, {args.adapters} adapters "
          f"of rank {args.rank}")
    print(f"base model: {base_tps:.1f} output tok/s")
    print(f"LoRA:       {lora_tps:.1f} output tok/s ({lora_tps / base_tps:.2f}x base; goal 0.7x)")
    print(f"LoRA kernels outside the fused decode stack: "
          f"{1e3 * clock.seconds / max(steps, 1):.2f} ms per step over {steps} steps")
    print(f"fused decode stack (deltas included): base "
          f"{1e3 * base_stack.seconds / max(base_steps, 1):.2f}"
          f" ms per step over {base_steps} steps, LoRA "
          f"{1e3 * lora_stack.seconds / max(steps, 1):.2f}")


if __name__ == "__main__":
    main()
