"""The fused decode stack on GGUF blocks and fp8 weights (``octavo_layer``'s projections typed
by ggml type or ``OCTAVO_WEIGHT_FP8_PAIRS``, cpu_layer.c): layers whose projections are
quantized compute what the same kernels called one by one compute, bit for bit, and each
quantized projection inside them the dense product of its dequantized weight within the
kernel's stated bound (Q8 activations: test_quant_gemm's; fp8: fp32 sums of exact bf16
products); a GGUF model kept in its blocks decodes in the fused stack with the tokens and
logprobs of its layers run one by one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GgmlType

from octavo import LLM, SamplingParams
from octavo.cpu import decode_layer, kernels
from octavo.cpu.quant_gemm import quant_matmul, quant_q8_available
from octavo.models.loader.dequant import dequantize_blocks
from octavo.testing.gguf_blocks import random_blocks
from octavo.testing.seeds import draw_seed
from tests.core.cpu.test_quant_gemm import BF16_U, matmul_bound, q8_terms
from tests.core.loader_helpers import TinyGguf

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not kernels.pair_gemm_available(),
                                 reason="the fused call needs the pair GEMM (AVX512-BF16)")]
PAIRS = decode_layer.WEIGHT_PAIRS
FP8 = decode_layer.WEIGHT_FP8_PAIRS
# Odd sizes: 96 hidden (3 blocks of 32), 3 heads and 1 kv head of 32, 224 intermediate (7
# blocks: its gate/up of 448 is no whole number of pair panel pairs, which only blocks serve).
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 3, 1, 32, 224
# Per layer, the types of qkv, o, gate/up, down (PAIRS: dense packed bf16; gate/up stays
# quantized, as the dense fused gate/up takes whole pairs of 16-column panels).
MIXES = {"q4_1": (GgmlType.Q4_1,) * 4,
         "mixed": (GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_1, PAIRS),
         # types without a VNNI kernel: the fp32 decode kernel
         "fp32-kernel": (GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q5_1, GgmlType.Q5_0),
         # an fp8 checkpoint's layers (octavo.cpu.fp8_gemm), one projection dense
         "fp8": (FP8, FP8, FP8, PAIRS)}


@dataclass
class Projection:
    """One projection's weight as the fused call takes it, and as the reference uses it."""

    type: int
    stored: torch.Tensor  # the blocks, or the packed pairs (of bf16, or of fp8 bytes)
    dense: torch.Tensor  # [out, in] fp32: the blocks or fp8 weight dequantized, or bf16's
    bias: torch.Tensor | None  # fp32
    scale: torch.Tensor | None = None  # fp8's per output column, padded as the kernel reads

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The product as the layers one by one compute it (QuantGemm: bf16 result, then
        the bias in bf16; the pair GEMM: the bias before the single rounding)."""
        out, inp = self.dense.shape
        if self.type == PAIRS:
            return kernels.pair_gemm(x, self.stored, self.bias, out)
        if self.type == FP8:
            assert self.scale is not None
            return kernels.fp8_pair_gemm(x, self.stored, self.scale, self.bias, out)
        y = quant_matmul(x, self.stored, self.type, out, inp)
        return y if self.bias is None else y + self.bias.bfloat16()

    def check_dense(self, x: torch.Tensor, y: torch.Tensor, where: str) -> None:
        """``y`` (this quantized projection's bf16 result on ``x``) is the dense product of
        the dequantized weight within its kernel's bound (``matmul_bound``: Q8 activations
        or fp32), plus the bf16 rounding of the result and, with a bias, of the sum."""
        exact = x.double() @ self.dense.double().T
        q8 = (q8_terms(self.stored.numpy(), self.dense, GgmlType(self.type))
              if self.type != FP8 and quant_q8_available(self.type) else None)
        bound = matmul_bound(x.float(), self.dense, q8)
        bound = bound + BF16_U * (exact.abs() + bound)
        if self.bias is not None:
            exact = exact + self.bias.double()
            bound = bound + BF16_U * (exact.abs() + bound)
        error = (y.double() - exact).abs()
        assert (error <= bound).all(), f"{where}: {(error / bound).max():.3g} x the bound"


def projection(ggml_type: int, out: int, inp: int, bias: bool,
               gen: np.random.Generator) -> Projection:
    b = (torch.from_numpy(gen.standard_normal(out, dtype=np.float32) * 0.1).bfloat16().float()
         if bias else None)  # a bf16 model's bias, as QuantGemm.bias32 holds it
    if ggml_type == PAIRS:
        dense = torch.from_numpy(gen.standard_normal((out, inp), dtype=np.float32) * 0.05)
        dense = dense.bfloat16()
        return Projection(PAIRS, kernels.pack_pair_weight(dense), dense.float(), b)
    if ggml_type == FP8:  # every e4m3 value but NaN is drawn, subnormals included
        codes = gen.choice([c for c in range(256) if c & 0x7F != 0x7F], (out, inp))
        weight = torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fn)
        scale = torch.from_numpy(gen.uniform(0.5, 2.0, out).astype(np.float32)) / 448
        return Projection(FP8, kernels.pack_pair_weight(weight.view(torch.uint8)),
                          weight.float() * scale[:, None], b,
                          kernels.pack_bias(scale, kernels.PAIR_PANEL))
    blocks = torch.from_numpy(random_blocks(GgmlType(ggml_type), out, inp, gen))
    weight = dequantize_blocks(blocks, int(ggml_type), (out, inp)).float()
    return Projection(int(ggml_type), blocks, weight, b)


@dataclass
class Layer:
    norms: tuple[torch.Tensor, torch.Tensor]
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection

    def weights(self) -> kernels.LayerWeights:
        p = (self.qkv, self.o, self.gate_up, self.down)
        ptr = [w.stored.data_ptr() for w in p]
        bias = [None if w.bias is None else w.bias.data_ptr() for w in p]
        scale = [None if w.scale is None else w.scale.data_ptr() for w in p]
        return kernels.LayerWeights(
            input_norm=self.norms[0].data_ptr(), post_norm=self.norms[1].data_ptr(),
            qkv=ptr[0], o=ptr[1], gate_up=ptr[2], down=ptr[3], qkv_bias=bias[0],
            o_bias=bias[1], gate_up_bias=bias[2], down_bias=bias[3], qkv_scale=scale[0],
            o_scale=scale[1], gate_up_scale=scale[2], down_scale=scale[3], qkv_type=p[0].type,
            o_type=p[1].type, gate_up_type=p[2].type, down_type=p[3].type, hidden=HIDDEN,
            num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate=INTER,
            qkv_lora=None, o_lora=None, gate_up_lora=None, down_lora=None,
            eps=1e-5, scale=HEAD_DIM**-0.5)


def random_layer(types: tuple[int, ...], gen: np.random.Generator) -> Layer:
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    shapes = [(qkv, HIDDEN), (HIDDEN, HEADS * HEAD_DIM), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    norms = tuple(torch.from_numpy(1 + 0.1 * gen.standard_normal(HIDDEN, dtype=np.float32))
                  .bfloat16() for _ in range(2))
    projections = [projection(t, out, inp, bias=i == 0, gen=gen)  # a bias on qkv, as Qwen2's
                   for i, (t, (out, inp)) in enumerate(zip(types, shapes, strict=True))]
    return Layer(norms, *projections)  # type: ignore[arg-type]


def layer_by_layer(layer: Layer, step: dict, hidden: torch.Tensor,
                   residual: torch.Tensor | None, cache: torch.Tensor,
                   products: list[tuple[Projection, torch.Tensor, torch.Tensor]],
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer as the portable layers compute it, kernel by kernel; each quantized
    projection's input and result appended to ``products``."""
    def project(p: Projection, x: torch.Tensor) -> torch.Tensor:
        y = p(x)
        if p.type != PAIRS:
            products.append((p, x, y.clone()))  # before RoPE rotates q and k in place
        return y

    t, q_size, kv_size = hidden.shape[0], HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    normed = kernels.rms_norm(hidden, residual, layer.norms[0], 1e-5)
    qkv = project(layer.qkv, normed)
    q = qkv[:, :q_size].view(t, HEADS, HEAD_DIM)
    k = qkv[:, q_size:q_size + kv_size].view(t, KV_HEADS, HEAD_DIM)
    kernels.rope_(q, k, step["cos"].view(t, 1, HEAD_DIM), step["sin"].view(t, 1, HEAD_DIM))
    kernels.write_kv(cache, qkv[:, q_size:q_size + kv_size], qkv[:, q_size + kv_size:],
                     step["slot_mapping"])
    attn = kernels.decode_attention(q, cache, step["slots"], step["seq_lens"], step["max_len"],
                                    KV_HEADS, HEAD_DIM**-0.5)
    residual_out = project(layer.o, attn.view(t, q_size))
    normed = kernels.rms_norm(residual_out, hidden, layer.norms[1], 1e-5)
    act = kernels.silu_and_mul(project(layer.gate_up, normed))
    return project(layer.down, act), residual_out


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("mix", list(MIXES))
def test_quantized_layers_compute_what_their_kernels_do_one_by_one(mix: str, rows: int) -> None:
    """Two layers on fresh random blocks and inputs: ``decode_layers`` gives the bits of the
    kernels called one by one (the same kernels, the same roundings), whose quantized
    products are the dense products of the dequantized weights within the bound of
    ``test_quant_gemm`` (int8 activations per 32 values: at most max|x| / 254 each)."""
    seed = draw_seed()
    gen = np.random.default_rng(seed)
    layers = [random_layer(MIXES[mix], gen) for _ in range(2)]
    blocks, max_len, width = 12, 20, KV_HEADS * HEAD_DIM
    caches = [torch.from_numpy(gen.standard_normal((2, blocks * 16, width), dtype=np.float32))
              .bfloat16() for _ in layers]
    seq_lens = torch.from_numpy(gen.integers(1, max_len + 1, rows))
    slots = torch.from_numpy(gen.permutation(blocks * 16)[: rows * max_len]).view(rows, max_len)
    step = {"cos": torch.from_numpy(gen.standard_normal((rows, HEAD_DIM), dtype=np.float32))
            .bfloat16(), "slots": slots.contiguous(), "seq_lens": seq_lens, "max_len": max_len,
            "slot_mapping": slots[torch.arange(rows), seq_lens - 1].contiguous()}
    step["sin"] = step["cos"].flip(-1).contiguous()
    fused_step = kernels.DecodeStep(
        tokens=rows, cos=step["cos"].data_ptr(), sin=step["sin"].data_ptr(),
        slot_mapping=step["slot_mapping"].data_ptr(), slots=step["slots"].data_ptr(),
        seq_lens=seq_lens.data_ptr(), max_len=max_len, prefix_slots=None, prefix_len=0,
        lora_sorted_tokens=None, lora_starts=None, lora_counts=None)
    x = torch.from_numpy(gen.standard_normal((rows, HIDDEN), dtype=np.float32)).bfloat16()

    h, residual, looped = x.clone(), None, [c.clone() for c in caches]
    products: list[tuple[Projection, torch.Tensor, torch.Tensor]] = []
    for layer, cache in zip(layers, looped, strict=True):
        h, residual = layer_by_layer(layer, step, h, residual, cache, products)
    stacked = [c.clone() for c in caches]
    stack = kernels.LayerStack([layer.weights() for layer in layers], stacked)
    out, stream = kernels.decode_layers(stack, fused_step, x.clone())
    assert torch.equal(out, h) and torch.equal(stream, residual), f"seed={seed}"
    assert all(torch.equal(a, b) for a, b in zip(stacked, looped)), f"seed={seed}"
    for i, (p, inp, y) in enumerate(products):
        name = "fp8" if p.type == FP8 else GgmlType(p.type).name
        p.check_dense(inp, y, f"seed={seed} product {i} ({name})")


def fused_and_layer_by_layer(llm: LLM, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch,
                             max_tokens: int) -> list[tuple[list, list, list, list]]:
    """Each prompt's greedy tokens and logprobs with decode steps in the fused stack, then
    with its layers one by one (the fused calls' step refused: the portable layers on the
    same quantized GEMMs); the fused stack must have run, and only in the first pass.
    ``llm`` runs without prefix caching: a second pass's prompts would otherwise start from
    the first's cached blocks, and a remainder of up to 8 rows takes the decode kernel (Q8
    activations) where the whole prompt took bf16 panels."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=3)
    stack = kernels.decode_layers
    calls = [0]

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return stack(*args, **kwargs)

    def run() -> list:
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    monkeypatch.setattr(kernels, "decode_layers", counted)
    fused = run()
    assert calls[0] > 0, "the fused stack did not run"
    monkeypatch.setattr(decode_layer, "decode_step", lambda *args, **kwargs: None)
    calls[0] = 0
    one_by_one = run()
    assert calls[0] == 0, "the fused stack ran"
    return [(a.outputs[0].token_ids, b.outputs[0].token_ids, a.outputs[0].logprobs,
             b.outputs[0].logprobs) for a, b in zip(fused, one_by_one, strict=True)]


def test_a_gguf_kept_in_blocks_decodes_fused_as_layer_by_layer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny Llama GGUF in Q4_1 with a Q8_0 embedding, kept in its blocks: the fused
    stack's greedy tokens and logprobs are those of its layers one by one. (Biases: the
    test above; a tiny Qwen2 GGUF does not load through ``LLM``, its o_proj.bias wanted.)"""
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    types = {f"blk.{i}.{n}.weight": GgmlType.Q4_1 for i in range(2) for n in names}
    path = tmp_path / "tiny.gguf"
    TinyGguf(types=types | {"token_embd.weight": GgmlType.Q8_0, "output.weight": GgmlType.Q8_0}
             ).write(path, rng)
    llm = LLM(model=str(path), dtype="bfloat16", quantization="gguf", max_model_len=128,
              kv_cache_memory=8 * 2**20, enable_prefix_caching=False)
    model = llm.llm_engine.core.executor.worker.runner.model
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.uint8
    prompts = [[int(t) for t in rng.integers(0, 200, n)] for n in (3, 11, 30)]
    for i, (fused, one_by_one, fused_lp, one_by_one_lp) in enumerate(
            fused_and_layer_by_layer(llm, prompts, monkeypatch, max_tokens=8)):
        assert fused == one_by_one, f"seed={seed} request {i}"
        assert fused_lp == one_by_one_lp, f"seed={seed} request {i}: same kernels, same bits"
