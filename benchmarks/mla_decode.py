"""Time a CPU decode step of multi-head latent attention at DeepSeek-V2-Lite's shapes (16
heads, kv_lora_rank 512, rope 64, nope 128, v 128; hidden 2048) over a stack of random
latent attention layers, three ways:

- ``absorbed``: the latent cache, decode rows in the absorbed form (``TorchMLAImpl``'s
  default; bf16 on the CPU's fused decode kernel, ``CpuMLAImpl``);
- ``expanded``: the latent cache, each step's context expanded through ``kv_b_proj`` again
  (``absorbed_decode = False``, the form prompt chunks use);
- ``full-kv``: the same layers with the latent expanded to full keys and values once, when
  written - the cache a model without latent attention would keep (16 x (192 + 128) values
  per token and layer against 576) - and plain attention over it.

Each variant's output is checked against ``expanded``'s before it is timed.

    .venv/bin/python benchmarks/mla_decode.py [--layers 4] [--batch 1,16] [--context 512,2048]
        [--dtype bf16] [--threads 1] [--repeats 10] [--output-json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from octavo.attention.base import MLADims
from octavo.attention.step_plan import DecodeBatch, StepPlan
from octavo.attention.torch_mla import TorchMLAImpl
from octavo.cpu.attention import CpuMLAImpl
from octavo.entrypoints.table import format_table

# DeepSeek-V2-Lite: 16 heads of 128 + 64 key dims and 128 value dims, a 512 + 64 latent.
V2_LITE = MLADims(num_heads=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  kv_lora_rank=512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2}  # relative to the output's scale


@dataclass
class Row:
    variant: str
    batch: int
    context: int
    layers: int
    ms_per_step: float
    cache_bytes_per_token_layer: int


class Layer:
    """One random latent attention layer's weights and caches for ``batch`` rows of
    ``context`` tokens (the latent rows and, for full-kv, the expanded keys and values)."""

    def __init__(self, dims: MLADims, batch: int, context: int, dtype: torch.dtype,
                 gen: torch.Generator) -> None:
        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dtype)

        self.kv_b_proj = torch.nn.Linear(dims.kv_lora_rank,
                                         dims.num_heads * (dims.qk_nope_head_dim
                                                           + dims.v_head_dim), bias=False)
        self.kv_b_proj.weight.data = rand(*self.kv_b_proj.weight.shape,
                                          scale=dims.kv_lora_rank ** -0.5)
        self.rows = rand(batch * context, dims.latent_dim)
        latent, k_pe = self.rows.split([dims.kv_lora_rank, dims.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(latent).view(batch, context, dims.num_heads, -1)
        k_nope, values = kv.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=-1)
        pe = k_pe.view(batch, context, 1, -1).expand(-1, -1, dims.num_heads, -1)
        self.keys = torch.cat([k_nope, pe], dim=-1).transpose(1, 2).contiguous()
        self.values = values.transpose(1, 2).contiguous()
        self.q_nope = rand(batch, dims.num_heads, dims.qk_nope_head_dim)
        self.q_pe = rand(batch, dims.num_heads, dims.qk_rope_head_dim)


def decode_batch(batch: int, context: int) -> tuple[DecodeBatch, StepPlan]:
    """Each row's context: its own ``context`` consecutive slots."""
    slots = torch.arange(batch * context)
    decode = DecodeBatch(None, slots, torch.full((batch, 1), context), context, True)
    return decode, StepPlan(decode, [], 16)


def run_variant(variant: str, layers: list[Layer], dims: MLADims, decode: DecodeBatch,
                plan: StepPlan, scale: float, dtype: torch.dtype) -> list[torch.Tensor]:
    outputs = []
    for layer in layers:
        if variant == "full-kv":
            queries = torch.cat([layer.q_nope, layer.q_pe], dim=-1)[:, :, None]
            out = F.scaled_dot_product_attention(queries, layer.keys, layer.values, scale=scale)
            outputs.append(out[:, :, 0])
            continue
        impl_cls = CpuMLAImpl if dtype == torch.bfloat16 else TorchMLAImpl
        impl = impl_cls(dims, scale, layer.kv_b_proj)
        impl.absorbed_decode = variant == "absorbed"
        outputs.append(impl._decode(layer.q_nope, layer.q_pe, layer.rows, decode, plan))
    return outputs


def measure(variant: str, layers: list[Layer], dims: MLADims, batch: int, context: int,
            dtype: torch.dtype, repeats: int) -> float:
    decode, plan = decode_batch(batch, context)
    scale = (dims.qk_nope_head_dim + dims.qk_rope_head_dim) ** -0.5
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        run_variant(variant, layers, dims, decode, plan, scale, dtype)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def check(layers: list[Layer], dims: MLADims, batch: int, context: int,
          dtype: torch.dtype) -> None:
    decode, plan = decode_batch(batch, context)
    scale = (dims.qk_nope_head_dim + dims.qk_rope_head_dim) ** -0.5
    reference = run_variant("expanded", layers, dims, decode, plan, scale, dtype)
    for variant in ("absorbed", "full-kv"):
        for got, want in zip(run_variant(variant, layers, dims, decode, plan, scale, dtype),
                             reference, strict=True):
            error = (got.float() - want.float()).abs().max().item()
            bound = TOLERANCE[dtype] * want.float().abs().max().item()
            assert error <= bound, f"{variant} differs from expanded by {error:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--context", default="512,2048")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--output-json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype, dims = DTYPES[args.dtype], V2_LITE
    per_token = {"absorbed": dims.latent_dim, "expanded": dims.latent_dim,
                 "full-kv": dims.num_heads * (dims.qk_nope_head_dim + dims.qk_rope_head_dim
                                              + dims.v_head_dim)}
    rows: list[Row] = []
    with torch.inference_mode():
        for batch in map(int, args.batch.split(",")):
            for context in map(int, args.context.split(",")):
                gen = torch.Generator().manual_seed(0)
                layers = [Layer(dims, batch, context, dtype, gen) for _ in range(args.layers)]
                check(layers, dims, batch, context, dtype)
                for variant, values in per_token.items():
                    ms = measure(variant, layers, dims, batch, context, dtype, args.repeats)
                    rows.append(Row(variant, batch, context, args.layers, ms,
                                    values * dtype.itemsize))
    print(format_table(["variant", "batch", "context", "layers", "ms/step", "cache B/token/layer"],
                       [[r.variant, r.batch, r.context, r.layers, f"{r.ms_per_step:.2f}",
                         r.cache_bytes_per_token_layer] for r in rows]))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
