"""Time the MoE expert kernels against each other: the loop over experts, torch's grouped
GEMM (``torch._grouped_mm``) and a padded batched GEMM, on the same sorted (token, slot)
pairs, for Mixtral-like shapes (8 experts, top-2) scaled to this machine.

    .venv/bin/python benchmarks/moe_kernel.py [--shapes tiny,small] [--tokens 1,16,64,256,1024]
        [--dtypes fp32,bf16] [--threads 1] [--repeats 20] [--output-json FILE]

``FusedMoE``'s choice of kernel rests on these figures (the comment above
``expert_kernel`` in ``octavo/models/layers/moe.py``); every variant's output is checked
against the loop's before it is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from octavo.entrypoints.table import format_table
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.moe import (
    ExpertKernel,
    grouped_experts,
    loop_experts,
    route_to_experts,
    select_experts,
)

# (experts, top_k, hidden, intermediate): Mixtral 8x7B is (8, 2, 4096, 14336).
SHAPES = {"tiny": (8, 2, 64, 96), "small": (8, 2, 512, 1792), "quarter": (8, 2, 1024, 3584)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # relative to the output's scale


def padded_bmm_experts(
    inputs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: torch.Tensor,
    act: torch.nn.Module,
) -> torch.Tensor:
    """Each expert's pairs padded to the busiest expert's count, then two ``bmm``s."""
    num_experts = len(counts)
    experts = torch.repeat_interleave(torch.arange(num_experts), counts)
    starts = counts.cumsum(0) - counts
    positions = torch.arange(len(inputs)) - starts[experts]
    padded = inputs.new_zeros(num_experts, int(counts.max()), inputs.shape[1])
    padded[experts, positions] = inputs
    hidden = act(torch.bmm(padded, w13.transpose(1, 2)))
    return torch.bmm(hidden, w2.transpose(1, 2))[experts, positions]


KERNELS: dict[str, ExpertKernel] = {"loop": loop_experts, "grouped": grouped_experts,
                                    "padded_bmm": padded_bmm_experts}


@dataclass
class Row:
    shape: str
    dtype: str
    tokens: int
    ms: dict[str, float]  # median per kernel call

    @property
    def fastest(self) -> str:
        return min(self.ms, key=self.ms.get)


def median_ms(kernel: ExpertKernel, args: tuple, repeats: int) -> float:
    kernel(*args)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(shape: str, dtype: torch.dtype, tokens: int, repeats: int) -> dict[str, float]:
    num_experts, top_k, hidden, intermediate = SHAPES[shape]
    w13 = torch.randn(num_experts, 2 * intermediate, hidden, dtype=dtype) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, intermediate, dtype=dtype) * intermediate ** -0.5
    x = torch.randn(tokens, hidden, dtype=dtype)
    weights, expert_ids = select_experts(torch.randn(tokens, num_experts), top_k)
    routes = route_to_experts(weights, expert_ids, 0, num_experts)
    args = (x[routes.tokens], w13, w2, routes.counts, SiluAndMul())
    with torch.inference_mode():
        reference = loop_experts(*args).float()
        for name, kernel in KERNELS.items():
            error = (kernel(*args).float() - reference).abs().max().item()
            scale = reference.abs().max().item()
            assert error <= TOLERANCE[dtype] * scale, f"{name} differs from the loop by {error}"
        return {name: median_ms(kernel, args, repeats) for name, kernel in KERNELS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="tiny,small")
    parser.add_argument("--tokens", default="1,16,64,256,1024")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output-json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = [Row(shape, dtype, tokens, measure(shape, DTYPES[dtype], tokens, args.repeats))
            for shape in args.shapes.split(",") for dtype in args.dtypes.split(",")
            for tokens in map(int, args.tokens.split(","))]
    print(f"median ms per expert-kernel call, {args.threads} thread(s); "
          f"shapes (experts, top_k, hidden, intermediate): "
          + ", ".join(f"{name} {SHAPES[name]}" for name in args.shapes.split(",")))
    headers = ["shape", "dtype", "tokens", *KERNELS, "fastest", "loop/grouped"]
    print(format_table(headers, [
        [row.shape, row.dtype, row.tokens, *(f"{row.ms[name]:.3f}" for name in KERNELS),
         row.fastest, f"{row.ms['loop'] / row.ms['grouped']:.2f}"] for row in rows]))
    if args.output_json:
        with open(args.output_json, "w") as file:
            json.dump({"threads": args.threads,
                       "shapes": {name: SHAPES[name] for name in args.shapes.split(",")},
                       "rows": [asdict(row) for row in rows]}, file, indent=1)


if __name__ == "__main__":
    main()
