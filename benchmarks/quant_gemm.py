"""Quantized GEMV/GEMM on GGUF blocks (``octavo.cpu.quant_gemm``) against the bf16 dense
path (``octavo.cpu.gemm.CpuGemm``) at SmolLM2-135M's shapes, by row count.

Each cell is the median microseconds of one call (after warm-up, cycling through ``COPIES``
weights of the shape so that they come from past the L2 cache), and, for the quantized
paths, in brackets the GB/s of weight bytes that time streams: a decode step is memory-bound,
so a kernel that reads 4.5-bit weights at the bf16 path's GB/s runs ~3.5x as fast. Types
with a VNNI kernel get two columns: ``TYPE q8`` (activations quantized to int8 per 32
values, ``Q8_ACTIVATIONS``: the Q8 decode kernel up to 8 rows, the many-row kernel of
cpu_quant_gemm.c up to ``GEMM_Q8_ROWS``, bf16 panels above) and ``TYPE`` (the fp32
decode kernel up to 8 rows, dequantized bf16 panels and torch's matmul above), to keep the
faster per shape.
Weights are random blocks with sane scales (``octavo.testing.gguf_blocks``): the time does
not depend on the values. Shapes whose rows are not whole blocks of a type (576 inputs are
not whole 256-value k-quant blocks: llama.cpp's quantizer gives those rows Q5_0/Q8_0) leave
that type's column out.

    python benchmarks/quant_gemm.py --threads 2 --rows 1,2,4,8,32,128 --types Q4_1,Q8_0,Q4_K,Q6_K
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from typing import Any

import numpy as np
import torch
from cpu_gemm import COPIES, time_path
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GgmlType

from octavo.cpu import quant_gemm
from octavo.cpu.gemm import CpuGemm
from octavo.cpu.platform import CpuPlatform, cpu_has_native_bf16
from octavo.cpu.quant_gemm import quant_gemm_q8_available, quant_matmul, quant_q8_available
from octavo.testing.gguf_blocks import random_blocks

# SmolLM2-135M: (out, in) of its linear layers' weights.
SHAPES = {"q/o 576x576": (576, 576), "k/v 192x576": (192, 576),
          "gate_up 3072x576": (3072, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}


def run(x: torch.Tensor, q8: bool, **weight: Any) -> torch.Tensor:
    """quant_matmul with the decode kernel on Q8 activations (VNNI) or on fp32 ones."""
    quant_gemm.Q8_ACTIVATIONS = q8
    return quant_matmul(x, **weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rows", default="1,2,4,8,32,128")
    parser.add_argument("--types", default="Q4_1,Q8_0,Q4_0,Q4_K,Q6_K")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="labels of SHAPES")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    types = [GgmlType[name] for name in args.types.split(",")]
    native = cpu_has_native_bf16()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), load average {os.getloadavg()}")
    gen = np.random.default_rng(int(time.time()))
    for label in args.shapes.split(","):
        out_f, in_f = SHAPES[label]
        calls = {"bf16 CpuGemm": [
            CpuGemm(torch.randn(out_f, in_f).bfloat16() * 0.05, None, native,
                    CpuPlatform.has_amx()) for _ in range(COPIES)]}
        nbytes = {"bf16 CpuGemm": out_f * in_f * 2}
        for ggml_type in types:
            if in_f % GGML_QUANT_SIZES[ggml_type][0]:
                continue  # llama.cpp's quantizer gives such rows another type
            copies = [torch.from_numpy(random_blocks(ggml_type, out_f, in_f, gen))
                      for _ in range(COPIES)]
            vnni = quant_q8_available(int(ggml_type)) or quant_gemm_q8_available(int(ggml_type))
            kinds = [True, False] if vnni else [False]
            for q8 in kinds:
                name = f"{ggml_type.name}{' q8' if q8 else ''}"
                calls[name] = [functools.partial(run, q8=q8, blocks=b, ggml_type=int(ggml_type),
                                                 out_features=out_f, in_features=in_f)
                               for b in copies]
                nbytes[name] = copies[0].numel()
        print(f"\n{label}: microseconds per call [weight GB/s], by rows T")
        print("| T | " + " | ".join(calls) + " |")
        print("|---" * (len(calls) + 1) + "|")
        for t in rows:
            x = torch.randn(t, in_f).bfloat16()
            cells = []
            for name, path in calls.items():
                seconds = time_path(path, x, args.repeats)
                cells.append(f"{seconds * 1e6:.0f} [{nbytes[name] / seconds / 1e9:.1f}]")
            print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
