"""The CPU LoRA shrink/expand: the C kernels (``octavo.cpu.lora``) in one call per layer
(``bind_delta``, what the CPU platform runs) and as a shrink/expand pair per slice, the
portable ones (``octavo.lora.ops``: tokens grouped by adapter, one matmul per
adapter present) and a per-adapter loop (each slot multiplies every token, its rows kept by
a mask), on SmolLM2-135M's projection shapes: the time of one layer's delta for a step of
``--tokens`` tokens spread round-robin over ``--adapters`` rank-``--rank`` adapters (median
of ``--repeats`` calls after warm-up; the tokens grouped by slot once, as the model runner
does once per step). The last lines sum the 30 layers of a step.

    python benchmarks/lora_ops.py --threads 2 --tokens 1,16,64,256 --adapters 8 --rank 16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from octavo.cpu import lora as cpu_lora
from octavo.lora import ops
from octavo.lora.ops import Expand, Shrink, TokenGroups, group_tokens

LAYERS = 30  # SmolLM2-135M's

# SmolLM2-135M: (input, [output slices]) of the projections LoRA wraps.
SHAPES = {"qkv": (576, [576, 192, 192]), "o": (576, [576]), "gate_up": (576, [1536, 1536]),
          "down": (1536, [576])}


def per_adapter_loop(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                     token_lora: torch.Tensor, offset: int, size: int) -> None:
    """The naive delta: every slot over every token, masked to its own tokens."""
    target = y.narrow(1, offset, size)
    for slot in range(a.shape[0]):
        mask = (token_lora == slot).unsqueeze(1).to(y.dtype)
        target += mask * ((x.float() @ a[slot].float().t()) @ b[slot].float().t()).to(y.dtype)


def grouped(shrink: Shrink, expand: Expand, groups: TokenGroups, x: torch.Tensor,
            a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, token_lora: torch.Tensor,
            offset: int, size: int) -> None:
    buf = torch.empty(x.shape[0], a.shape[1])
    shrink(x, a, token_lora, buf, 1.0, groups)
    expand(y, buf, b, token_lora, offset, size, groups)


def layer_delta(kernel: Callable[..., None], x: torch.Tensor, y: torch.Tensor,
                token_lora: torch.Tensor,
                slices: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
    """One layer's delta, slice by slice, with ``kernel``."""
    offset = 0
    for a, b, size in slices:
        kernel(x, a, b, y, token_lora, offset, size)
        offset += size


def one_call(x: torch.Tensor, y: torch.Tensor,
             slices: list[tuple[torch.Tensor, torch.Tensor, int]]) -> Callable[..., object]:
    """The layer's delta in one C call: its slices stacked as a wrapped layer holds them."""
    offsets = [sum(size for _, _, size in slices[:i]) for i in range(len(slices))]
    delta = cpu_lora.bind_delta(torch.stack([a for a, _, _ in slices]),
                                torch.cat([b for _, b, _ in slices], dim=1),
                                [(offset, size) for offset, (_, _, size) in zip(offsets, slices)])
    assert delta is not None
    return partial(delta, x, y)


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", default="1,16,64,256")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    assert cpu_lora.available(), "the CPU kernels' library is not built here"
    print(f"{'layer':>8} {'tokens':>6} {'C 1 call':>9} {'C us':>9} {'torch us':>9} "
          f"{'loop us':>9} {'C vs torch':>10}")
    token_counts = [int(t) for t in args.tokens.split(",")]
    step = dict.fromkeys(token_counts, 0.0)
    step_one = dict.fromkeys(token_counts, 0.0)
    for name, (inp, sizes) in SHAPES.items():
        for tokens in token_counts:
            x = torch.randn(tokens, inp, generator=generator).to(dtype)
            y = torch.zeros(tokens, sum(sizes), dtype=dtype)
            token_lora = (torch.arange(tokens) % args.adapters).to(torch.int32)
            slices = [(torch.randn(args.adapters, args.rank, inp, generator=generator).to(dtype),
                       torch.randn(args.adapters, size, args.rank,
                                   generator=generator).to(dtype), size) for size in sizes]

            case = (x, y, token_lora, slices)
            groups = group_tokens(token_lora, args.adapters)
            c_kernels = partial(grouped, cpu_lora.lora_shrink, cpu_lora.lora_expand, groups)
            torch_kernels = partial(grouped, ops.lora_shrink, ops.lora_expand, groups)
            one = median_seconds(partial(one_call(x, y, slices), groups), args.repeats)
            ours = median_seconds(partial(layer_delta, c_kernels, *case), args.repeats)
            portable = median_seconds(partial(layer_delta, torch_kernels, *case), args.repeats)
            loop = median_seconds(partial(layer_delta, per_adapter_loop, *case), args.repeats)
            step[tokens] += LAYERS * ours
            step_one[tokens] += LAYERS * one
            print(f"{name:>8} {tokens:>6} {one * 1e6:>9.1f} {ours * 1e6:>9.1f} "
                  f"{portable * 1e6:>9.1f} "
                  f"{loop * 1e6:>9.1f} {portable / ours:>9.2f}x")
    for tokens, seconds in step.items():
        print(f"C kernels, {LAYERS} layers of {tokens} tokens (one step): "
              f"{step_one[tokens] * 1e3:.2f} ms in one call per layer, {seconds * 1e3:.2f} ms "
              f"as a pair per slice")


if __name__ == "__main__":
    main()
