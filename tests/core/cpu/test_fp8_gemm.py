"""The fp8 pair GEMM (``octavo_fp8_pair_gemm``, ``octavo.cpu.fp8_gemm``): fp8 e4m3 weights
widened to bf16 exactly, so the product is the bf16 pair GEMM's on the widened weight, and
the dense product of the dequantized weight within fp32 sums and one bf16 rounding; fp8
checkpoints in a bf16 model take it for every projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import LLM
from octavo.cpu import kernels
from octavo.cpu.fp8_gemm import Fp8Gemm
from octavo.testing.seeds import draw_seed
from tests.core.cpu.test_cpu_decode_layer_quant import fused_and_layer_by_layer
from tests.core.cpu.test_quant_gemm import BF16_U, U
from tests.core.models.test_checkpoint_quant import tiny_quantized_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not kernels.pair_gemm_available(),
                                 reason="the fp8 GEMM is the pair GEMM's (AVX512-BF16)")]
E4M3 = torch.float8_e4m3fn
# Every e4m3 byte but the NaNs (0x7F, 0xFF): zeros, subnormals, normals up to +-448.
CODES = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)


def random_fp8(gen: np.random.Generator, out: int, inp: int) -> torch.Tensor:
    return torch.from_numpy(gen.choice(CODES, (out, inp))).view(E4M3)


def bf16_rows(gen: np.random.Generator, rows: int, inp: int) -> torch.Tensor:
    return torch.from_numpy(gen.standard_normal((rows, inp), dtype=np.float32)).bfloat16()


@pytest.mark.parametrize("shape", [(16, 2), (33, 64), (49, 130), (200, 576), (40, 2048)])
def test_the_fp8_gemm_is_the_dense_product_of_its_weights(shape: tuple[int, int]) -> None:
    """Odd shapes (a part panel, inputs no multiple of 32), every code, per-column scales and
    a bias; rows under one tile (widened as they load), several tiles (widened once per
    panel group) and, at 2048 inputs, more than one chunk of rows (126): the fp32 sums of
    the exact products, scaled, rounded to bf16 once."""
    seed = draw_seed()
    gen = np.random.default_rng(seed)
    out, inp = shape
    weight = random_fp8(gen, out, inp)
    scale = torch.from_numpy(gen.uniform(0.5, 2.0, out).astype(np.float32)) / 448
    bias = torch.from_numpy(gen.standard_normal(out, dtype=np.float32)).bfloat16()
    gemm = Fp8Gemm(weight, scale[:, None], bias)
    dense = weight.double() * scale.double()[:, None]
    x = bf16_rows(gen, 130 if inp == 2048 else 37, inp)
    y = gemm(x)
    exact = x.double() @ dense.T + bias.double()
    bound = inp * U / (1 - inp * U) * (x.double().abs() @ dense.abs().T)
    bound = bound + BF16_U * (exact.abs() + bound)
    error = (y.double() - exact).abs()
    assert (error <= bound).all(), f"seed {seed}: {(error / bound).max():.3g} x the bound"
    for rows in (1, 6):  # under one tile: the same sums in the same order, the same bits
        assert torch.equal(gemm(x[:rows]), y[:rows]), f"seed {seed}, {rows} rows"


def test_an_fp8_weight_widens_to_bf16_exactly() -> None:
    """With unit scales and no bias, the fp8 GEMM gives the bf16 pair GEMM's bits on the
    weight converted by torch (exact: e4m3 values are bf16 values), widened as they load
    (3 rows) and once per panel group (40 rows)."""
    seed = draw_seed()
    gen = np.random.default_rng(seed)
    weight = random_fp8(gen, 96, 256)
    gemm = Fp8Gemm(weight, torch.ones(96, 1), None)
    pairs = kernels.pack_pair_weight(weight.to(torch.bfloat16))
    for rows in (3, 40):
        x = bf16_rows(gen, rows, 256)
        assert torch.equal(gemm(x), kernels.pair_gemm(x, pairs, None, 96)), f"seed {seed}"


@pytest.mark.parametrize("name", ["fp8-per-tensor-static", "ct-fp8-per-channel"])
def test_an_fp8_checkpoint_decodes_on_the_fp8_gemm_fused_as_layer_by_layer(
        name: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny Llama written as an fp8 checkpoint, in bf16: each projection multiplies on the
    fp8 GEMM, its own fp8 weight given up for the packed copy; decode steps run in the fused
    stack with the tokens and logprobs of its layers one by one (the same kernels)."""
    seed = draw_seed()
    folder = tiny_quantized_model(tmp_path, name, seed)
    llm = LLM(model=str(folder), dtype="bfloat16", max_model_len=128,
              kv_cache_memory=8 * 2**20, enable_prefix_caching=False)
    model = llm.llm_engine.core.executor.worker.runner.model
    projections = [m for m in model.modules() if hasattr(m, "weight_scale")]
    assert projections and all(isinstance(m.cpu_gemm, Fp8Gemm) and m.weight.is_meta
                               for m in projections)
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, 200, n)] for n in (3, 11, 30)]
    for i, (fused, one_by_one, fused_lp, one_by_one_lp) in enumerate(
            fused_and_layer_by_layer(llm, prompts, monkeypatch, max_tokens=8)):
        assert fused == one_by_one, f"seed={seed} request {i}"
        assert fused_lp == one_by_one_lp, f"seed={seed} request {i}: same kernels, same bits"
    llm.shutdown()
