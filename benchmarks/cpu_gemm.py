"""The CPU's bf16 GEMM paths side by side, by row count: where each one wins on this CPU.

For SmolLM2-135M's linear layers as the model runs them (q/k/v and gate/up fused, the
tied head), each path multiplies ``T``
rows of fresh random bf16 activations by the layer's weight, and the table gives GFLOP/s
(median of ``--repeats`` timed calls after warm-up, cycling through ``COPIES`` weights of
the shape so that they come from past the L2 cache; they may sit in L3, so one-row figures
read faster than a model step's, which streams every weight from memory):

- ``F.linear``: PyTorch's bf16 linear on the plain weight;
- ``onednn bf16``: oneDNN's linear on the weight reordered once into its blocked layout;
- ``onednn fp32``: the same on an fp32 copy, activations converted (what ``CpuGemm`` uses
  from ``LARGE_ROWS`` rows when no AMX is present);
- ``panel``: Octavo's packed-panel GEMM (``octavo.cpu.kernels``), where it is built;
- ``pair``: Octavo's pair GEMM (AVX512-BF16 only), what ``CpuGemm`` uses there.

    python benchmarks/cpu_gemm.py --threads 2 --rows 1,4,16,32,64,128,256,512,1024,2048
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from octavo.cpu import kernels as cpu_kernels
from octavo.cpu.gemm import onednn_reorders_bf16

# SmolLM2-135M-Instruct: (out, in) of its linear layers' weights.
SHAPES = {"qkv 960x576": (960, 576), "o 576x576": (576, 576),
          "gate_up 3072x576": (3072, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}
COPIES = 8  # weights of each shape cycled through: 8 x 0.7-57 MB, past L2


def paths(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    found: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "F.linear": lambda x: F.linear(x, weight)}
    if onednn_reorders_bf16():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        found["onednn bf16"] = lambda x: torch.ops.mkldnn._linear_pointwise(
            x, packed, None, "none", [], "")
    packed32 = torch.ops.mkldnn._reorder_linear_weight(weight.float(), None)
    found["onednn fp32"] = lambda x: torch.ops.mkldnn._linear_pointwise(
        x.float(), packed32, None, "none", [], "").to(x.dtype)
    if cpu_kernels.gemm_available():
        panels = cpu_kernels.pack_gemm_weight(weight)
        found["panel"] = lambda x: cpu_kernels.gemm(x, panels, None, weight.shape[0])
    if cpu_kernels.pair_gemm_available():
        pairs = cpu_kernels.pack_pair_weight(weight)
        found["pair"] = lambda x: cpu_kernels.pair_gemm(x, pairs, None, weight.shape[0])
    return found


def time_path(calls: list[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor,
              repeats: int) -> float:
    """Median seconds of one call, cycling through the layer copies."""
    for call in calls:
        call(x)
    samples = []
    for i in range(repeats):
        call = calls[i % len(calls)]
        start = time.perf_counter()
        call(x)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rows", default="1,4,16,32,64,128,256,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), load average {os.getloadavg()}")
    generator = torch.Generator().manual_seed(int(time.time()))
    for label, (out_f, in_f) in tqdm(SHAPES.items(), desc="GEMM shapes", unit="shape"):
        weights = [torch.randn(out_f, in_f, generator=generator).bfloat16() * 0.05
                   for _ in range(COPIES)]
        per_path: dict[str, list] = {}
        for w in weights:
            for name, call in paths(w).items():
                per_path.setdefault(name, []).append(call)
        print(f"\n{label}: GFLOP/s by rows T (best marked *)")
        print("| T | " + " | ".join(per_path) + " |")
        print("|---" * (len(per_path) + 1) + "|")
        for t in rows:
            x = torch.randn(t, in_f, generator=generator).bfloat16()
            rates = {name: 2 * t * in_f * out_f / time_path(calls, x, args.repeats) / 1e9
                     for name, calls in per_path.items()}
            best = max(rates.values())
            cells = [f"{r:.0f}{'*' if r == best else ''}" for r in rates.values()]
            print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
