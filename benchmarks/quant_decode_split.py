"""Where a single-stream decode step of the default model goes (issue 45): dense bf16 (the
fused stack on packed pairs), the GGUF kept in its Q4_1 blocks with the fused stack
(``octavo_decode_layers`` on blocks), and the same blocks layer by layer (the portable
layers calling ``QuantGemm`` per projection: the path before the fused stack took blocks).

Per mode, one engine, a warm-up, then ``--repeats`` generations of one prompt of 32 tokens
and ``--output-len`` tokens; each decode step's milliseconds split into the decoder layers'
C time (``decode_layers``, or the ``QuantGemm`` calls of the layer-by-layer path), the LM
head, and the rest (Python: the layers' glue, the runner, the scheduler, the sampler).
Medians over the decode steps. The modes run in turn, ``--rounds`` times (paired on a
busy machine: compare within a round).

    python benchmarks/quant_decode_split.py --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from octavo import LLM, SamplingParams
from octavo.cpu import decode_layer, kernels
from octavo.cpu.quant import QuantGemm

MODES = ("dense", "gguf-fused", "gguf-layers")


class Clock:
    """Seconds spent inside wrapped callables, per decode step."""

    def __init__(self) -> None:
        self.inside: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside[name] = self.inside.get(name, 0.0) + time.perf_counter() - start
        return timed


def run_mode(mode: str, output_len: int, repeats: int) -> dict[str, float]:
    """Median milliseconds per decode step: total, layers' C time, head, rest."""
    quantization = "none" if mode == "dense" else "gguf"
    llm = LLM(quantization=quantization, max_model_len=512, enable_prefix_caching=False,
              seed=0)
    model = llm.llm_engine.core.executor.worker.runner.model
    clock = Clock()
    patches = {"decode_layers": kernels.decode_layers, "decode_step": decode_layer.decode_step}
    kernels.decode_layers = clock.wrap("layers", kernels.decode_layers)
    if mode == "gguf-layers":
        decode_layer.decode_step = lambda *args, **kwargs: None
        for module in model.model.layers.modules():
            gemm = getattr(module, "cpu_gemm", None)
            if isinstance(gemm, QuantGemm):
                module.cpu_gemm = clock.wrap("layers", gemm)
    compute_logits = model.compute_logits
    model.compute_logits = clock.wrap("head", compute_logits)  # type: ignore[method-assign]
    step = llm.llm_engine.step
    steps: list[tuple[float, dict[str, float]]] = []

    def timed_step() -> Any:
        clock.inside = {}
        start = time.perf_counter()
        out = step()
        steps.append((time.perf_counter() - start, dict(clock.inside)))
        return out

    llm.llm_engine.step = timed_step  # type: ignore[method-assign]
    prompt = [{"prompt_token_ids": [1 + (i * 37) % 4000 for i in range(32)]}]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompt, SamplingParams(max_tokens=4), use_tqdm=False)
    decode = []
    for _ in range(repeats):
        steps.clear()
        llm.generate(prompt, params, use_tqdm=False)
        decode += steps[1:]  # the first step is the prompt's
    llm.shutdown()
    kernels.decode_layers = patches["decode_layers"]
    decode_layer.decode_step = patches["decode_step"]

    def median(values: list[float]) -> float:
        return 1e3 * statistics.median(values)

    return {"step": median([w for w, _ in decode]),
            "layers": median([i.get("layers", 0.0) for _, i in decode]),
            "head": median([i["head"] for _, i in decode]),
            "rest": median([w - i.get("layers", 0.0) - i["head"] for w, i in decode])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {args.threads} thread(s), load average {os.getloadavg()}")
    print("| round | mode | ms/step | layers (C) | LM head | rest (Python) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            ms = run_mode(mode, args.output_len, args.repeats)
            print(f"| {r + 1} | {mode} | {ms['step']:.2f} | {ms['layers']:.2f} | "
                  f"{ms['head']:.2f} | {ms['rest']:.2f} |", flush=True)
    print(f"# load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
