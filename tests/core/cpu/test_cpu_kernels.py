"""The fused bf16 CPU kernels (octavo/kernels) against the portable PyTorch layers they
replace, on fresh random inputs laid out as a decoder layer passes them (views of wider
projections), and their wiring: a bf16 model built on the CPU uses them, and without a
compiler (or with OCTAVO_CPU_KERNELS=0) everything falls back to the portable code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octavo.attention.base import AttentionMetadata
from octavo.cpu import kernel_build
from octavo.cpu import kernels as cpu
from octavo.cpu.attention import CpuAttentionBackend
from octavo.cpu.layers import CpuLlamaMLP, CpuRMSNorm, use_cpu_layers
from octavo.cpu.platform import CpuPlatform
from octavo.models.base import CausalLM
from octavo.models.build import build_model
from octavo.models.config import RopeConfig
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.models.loader import load_model_files
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(cpu.library() is None, reason="no C compiler here")]

BF16 = torch.bfloat16


def generator() -> tuple[int, torch.Generator]:
    seed = draw_seed()
    return seed, torch.Generator().manual_seed(seed)


def assert_same_rounding(out: torch.Tensor, expected: torch.Tensor, seed: int) -> None:
    """The portable chain's result, but for rare last-bit flips: the kernel sums and
    takes exponentials in another order, which can move a value across a bf16 rounding
    boundary."""
    close = torch.isclose(out.float(), expected.float(), rtol=2**-6, atol=1e-3)
    assert close.all(), f"seed={seed}: {(~close).sum()} values differ beyond bf16 rounding"
    exact = (out == expected).float().mean().item()
    assert exact > 0.99, f"seed={seed}: only {exact:.2%} bit-identical"


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 3).to(BF16)


@pytest.mark.parametrize(("out_features", "in_features"), [(96, 64), (577, 1536), (13, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_is_a_bf16_linear(out_features: int, in_features: int, with_bias: bool) -> None:
    """Products summed in fp32, rounded once: within bf16 rounding of an fp32 reference
    (also when the sizes leave remainders: rows not a multiple of 4, columns of 32)."""
    seed, gen = generator()
    weight, x = randn(gen, out_features, in_features), randn(gen, 1, in_features)
    bias = randn(gen, out_features) if with_bias else None
    expected = torch.nn.functional.linear(x.float(), weight.float(),
                                          None if bias is None else bias.float())
    torch.testing.assert_close(cpu.gemv(x, weight, bias).float(), expected, rtol=2**-7,
                               atol=1e-2, msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.skipif(not cpu.gemm_available(), reason="panel GEMM needs AVX-512")
@pytest.mark.parametrize(("rows", "out_features", "in_features"),
                         [(1, 64, 32), (13, 96, 80), (29, 200, 576), (450, 70, 48)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_panel_gemm_is_a_bf16_linear(rows: int, out_features: int, in_features: int,
                                     with_bias: bool) -> None:
    """Within bf16 rounding of an fp32 reference, for row tiles cut short (rows not a
    multiple of 14), a padded last panel (columns not a multiple of 32), rows spanning
    several fp32 chunks (450 > 196) and rows of a strided view."""
    seed, gen = generator()
    weight = randn(gen, out_features, in_features)
    x = randn(gen, rows, in_features + 5)[:, :in_features]
    bias = randn(gen, out_features) if with_bias else None
    expected = torch.nn.functional.linear(x.float(), weight.float(),
                                          None if bias is None else bias.float())
    out = cpu.gemm(x, cpu.pack_gemm_weight(weight),
                   None if bias is None else cpu.pack_bias(bias, cpu.GEMM_PANEL), out_features)
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-2,
                               msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_is_the_portable_norm(rows: int, with_residual: bool) -> None:
    seed, gen = generator()
    norm = RMSNorm(576, 1e-5).to(BF16)
    norm.weight.data = randn(gen, 576)
    wide = randn(gen, rows, 700)  # x is a view with a row stride of 700
    x, residual = wide[:, :576], randn(gen, rows, 576)
    if with_residual:
        expected, expected_sum = norm(x.clone(), residual)
        out = cpu.rms_norm(x, residual, norm.weight, norm.eps)
        assert torch.equal(x, expected_sum), f"seed={seed}: the sum written into x"
    else:
        expected = norm(x)
        out = cpu.rms_norm(x, None, norm.weight, norm.eps)
    assert_same_rounding(out, expected, seed)


@pytest.mark.parametrize("rows", [1, 5, 200])
def test_silu_and_mul_is_the_portable_activation(rows: int) -> None:
    seed, gen = generator()
    x = randn(gen, rows, 2 * 1536 + 64)[:, :2 * 1536]
    assert_same_rounding(cpu.silu_and_mul(x), SiluAndMul()(x), seed)


@pytest.mark.parametrize("tokens", [1, 9, 130])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_is_the_portable_rotary_embedding(tokens: int, head_dim: int) -> None:
    seed, gen = generator()
    heads, kv_heads = 6, 2
    rotary = RotaryEmbedding(head_dim, RopeConfig(theta=100000.0))
    qkv = randn(gen, tokens, (heads + 2 * kv_heads) * head_dim)
    q = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 20000, (tokens,), generator=gen)
    expected_q, expected_k = rotary(positions, q, k)
    cos, sin = rotary.cos_sin(positions, BF16)
    cpu.rope_(q, k, cos, sin)
    assert_same_rounding(q, expected_q, seed)
    assert_same_rounding(k, expected_k, seed)


def test_write_kv_stores_each_row_at_its_slot() -> None:
    seed, gen = generator()
    cache = randn(gen, 2, 64, 128)
    before = cache.clone()
    kv = randn(gen, 5, 3 * 128)  # [k | v | unused]: strided keys, contiguous values
    slots = torch.randperm(64, generator=gen)[:5]
    cpu.write_kv(cache, kv[:, :128], kv[:, 128:256].contiguous(), slots)
    expected = before.clone()
    expected[0, slots], expected[1, slots] = kv[:, :128], kv[:, 128:256]
    assert torch.equal(cache, expected), f"seed={seed}"


@pytest.mark.parametrize("group", [1, 3, 5])
@pytest.mark.parametrize("head_dim", [64, 128, 48, 40])
def test_decode_attention_matches_a_dense_reference(group: int, head_dim: int) -> None:
    """Long, unequal contexts in random blocks; padding slots past each length hold noise.
    Head sizes: the two the vector code unrolls, another multiple of 16 it loops over, and
    one it leaves to portable C; groups of query heads split in pieces of up to 4."""
    seed, gen = generator()
    batch, kv_heads, block = 5, 2, 16
    heads = kv_heads * group
    lens = torch.randint(1, 400, (batch,), generator=gen)
    max_len = int(lens.max())
    num_blocks = batch * (-(-max_len // block)) + 3
    cache = torch.randn(2, num_blocks * block, kv_heads * head_dim, generator=gen).to(BF16)
    order = torch.randperm(num_blocks, generator=gen)
    slots = torch.empty(batch, max_len, dtype=torch.int64)
    for b in range(batch):
        blocks = order[b * (-(-max_len // block)):][: -(-max_len // block)]
        positions = torch.arange(max_len)
        slots[b] = blocks[positions // block] * block + positions % block
    # A strided view, as in a layer.
    q = torch.randn(batch, heads + 1, head_dim, generator=gen).to(BF16)[:, :heads]
    out = cpu.decode_attention(q, cache, slots.flatten(), lens, max_len, kv_heads, 0.125)
    for b in range(batch):
        rows = slots[b, :int(lens[b])]
        keys = cache[0, rows].double().view(-1, kv_heads, head_dim)
        values = cache[1, rows].double().view(-1, kv_heads, head_dim)
        keys, values = (t.repeat_interleave(group, dim=1) for t in (keys, values))
        scores = torch.einsum("hd,khd->hk", q[b].double(), keys) * 0.125
        expected = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
        # fp32 arithmetic but for the softmax weights, rounded to bf16 as SDPA rounds them
        # (each off by up to 2**-9 of itself), and the output's own bf16 rounding.
        torch.testing.assert_close(out[b].double(), expected, rtol=2**-7, atol=5e-3,
                                   msg=lambda m, b=b: f"seed={seed} request {b}: {m}")


def paged_contexts(gen: torch.Generator, lens: list[int], kv_heads: int, head_dim: int,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache holding one context per length in random blocks of 16, noise elsewhere, and
    each context's slots [R, max(lens)] (past a length: the last slot again)."""
    block = 16
    counts = [-(-length // block) for length in lens]
    num_blocks = sum(counts) + 3
    cache = (torch.randn(2, num_blocks * block, kv_heads * head_dim, generator=gen) * 2).to(BF16)
    order = torch.randperm(num_blocks, generator=gen)
    slots = torch.empty(len(lens), max(lens), dtype=torch.int64)
    for r, length in enumerate(lens):
        blocks = order[sum(counts[:r]):][:counts[r]]
        positions = torch.arange(max(lens)).clamp(max=length - 1)
        slots[r] = blocks[positions // block] * block + positions % block
    return cache, slots


def dense_attention(q: torch.Tensor, cache: torch.Tensor, rows: torch.Tensor, kv_heads: int,
                    scale: float) -> torch.Tensor:
    """fp64 causal attention of the last len(q) positions of a context over all of it."""
    group, head_dim = q.shape[1] // kv_heads, q.shape[2]
    keys, values = (cache[i, rows].double().view(len(rows), kv_heads, head_dim)
                    .repeat_interleave(group, dim=1) for i in (0, 1))
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    first = len(rows) - len(q)
    hidden = torch.arange(len(rows))[None, :] > first + torch.arange(len(q))[:, None]
    weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


needs_pair_attention = pytest.mark.skipif(
    not cpu.attention_available(64, torch.zeros(2, 1, 1)), reason="needs AVX512-BF16")


@needs_pair_attention
@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (1, 128), (4, 32), (2, 48)])
def test_prefill_attention_matches_a_dense_reference(group: int, head_dim: int) -> None:
    """Prompt chunks over contexts in random blocks: a one-token prompt, a fresh prompt,
    chunks over cached prefixes, a context past one 512-key softmax block; other rows of the
    output untouched."""
    seed, gen = generator()
    kv_heads = 2
    lens, query_lens = [1, 37, 600, 256, 1100], [1, 37, 30, 256, 5]
    cache, slots = paged_contexts(gen, lens, kv_heads, head_dim)
    starts = torch.tensor([0, *query_lens]).cumsum(0)[:-1] + 3  # 3 rows before the first
    tokens = int(starts[-1]) + query_lens[-1] + 2
    q = torch.randn(tokens, kv_heads * group + 1, head_dim, generator=gen).to(BF16)
    q = q[:, :kv_heads * group]  # a strided view, as in a layer
    out = torch.full(q.shape, 7.0, dtype=BF16)
    cpu.prefill_attention(out, q, cache, slots, starts, torch.tensor(query_lens),
                          torch.tensor(lens), kv_heads, head_dim**-0.5)
    written = torch.zeros(tokens, dtype=torch.bool)
    for r, (length, q_len) in enumerate(zip(lens, query_lens)):
        rows = slice(int(starts[r]), int(starts[r]) + q_len)
        written[rows] = True
        expected = dense_attention(q[rows], cache, slots[r, :length], kv_heads,
                                   head_dim**-0.5)
        # The weights rounded to bf16 (as PyTorch's flash attention rounds them), the
        # output's own bf16 rounding.
        torch.testing.assert_close(out[rows].double(), expected, rtol=2**-7, atol=2e-2,
                                   msg=lambda m, r=r: f"seed={seed} request {r}: {m}")
    assert (out[~written] == 7.0).all(), f"seed={seed}: rows of no chunk were written"


@needs_pair_attention
@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (1, 128), (2, 48)])
def test_a_shared_prefix_then_each_rows_own_positions(group: int, head_dim: int) -> None:
    """Cascade attention: decode rows over a shared 600-position prefix (prefix_attention)
    then their own positions (decode_attention, merging both) equal attention over the
    whole context."""
    seed, gen = generator()
    kv_heads, prefix = 2, 600
    own = [1, 5, 30, 16, 2, 7, 9, 3, 1]
    cache, slots = paged_contexts(gen, [prefix + n for n in own], kv_heads, head_dim)
    slots[:, :prefix] = slots[0, :prefix]  # the shared positions are one set of cache rows
    q = torch.randn(len(own), kv_heads * group, head_dim, generator=gen).to(BF16)
    scale = head_dim**-0.5
    state = cpu.prefix_attention(q, cache, slots[0, :prefix].contiguous(), kv_heads, scale)
    tails = slots[:, prefix:prefix + max(own)].contiguous()
    out = cpu.decode_attention(q, cache, tails.flatten(), torch.tensor(own), max(own),
                               kv_heads, scale, state)
    for b, n in enumerate(own):
        expected = dense_attention(q[b:b + 1], cache, slots[b, :prefix + n], kv_heads, scale)
        torch.testing.assert_close(out[b:b + 1].double(), expected, rtol=2**-7, atol=1e-2,
                                   msg=lambda m, b=b: f"seed={seed} row {b}: {m}")


def test_a_bf16_cpu_model_runs_its_layers_on_the_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched layers, and a prefill then a decode step (through the paged cache) within
    bf16 rounding of the same model built and run on the portable code: SDPA rounds the
    attention weights to bf16, the kernel keeps them in fp32."""
    seed, gen = generator()
    save_tiny_model("llama", tmp_path, seed=seed % 1000)
    model = build_model(load_model_files(str(tmp_path)), BF16, CpuAttentionBackend)
    CpuPlatform.prepare_model(model, BF16)
    assert sum(isinstance(m, CpuRMSNorm) for m in model.modules()) == 2 * model.num_layers + 1
    assert sum(isinstance(m, CpuLlamaMLP) for m in model.modules()) == model.num_layers
    ids = torch.randint(0, model.config.vocab_size, (12,), generator=gen)
    fused = prefill_then_decode(model, ids)
    try:
        monkeypatch.setenv(kernel_build.ENABLE_ENV, "0")
        cpu.library.cache_clear()
        model = build_model(load_model_files(str(tmp_path)), BF16, CpuAttentionBackend)
        portable = prefill_then_decode(model, ids)  # not prepared: PyTorch's ops only
    finally:
        monkeypatch.undo()
        cpu.library.cache_clear()
    for step, (a, b) in enumerate(zip(fused, portable)):
        diff = (a - b).abs().max().item()
        assert diff < 0.1, f"seed={seed}, step {step}: max logit diff {diff}"


def prefill_then_decode(model: CausalLM, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of the last token after a prefill of ``ids[:-1]``, then after decoding
    ``ids[-1]``; one block holds the whole sequence."""
    n = len(ids)
    kv_caches = [torch.zeros(2, 1, n, model.num_kv_heads, model.head_dim, dtype=BF16)
                 for _ in range(model.num_layers)]
    logits = []
    for start, end in ((0, n - 1), (n - 1, n)):
        metadata = AttentionMetadata(
            num_actual_tokens=end - start, num_reqs=1,
            query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
            seq_lens=torch.tensor([end], dtype=torch.int32),
            block_tables=torch.zeros(1, 1, dtype=torch.int32),
            slot_mapping=torch.arange(start, end), max_query_len=end - start, max_seq_len=end)
        with torch.inference_mode():
            hidden = model(ids[start:end], torch.arange(start, end), kv_caches, metadata)
        logits.append(model.compute_logits(hidden[-1:]).float())
    return logits


def test_loading_the_kernels_keeps_subnormal_floats() -> None:
    """-ffast-math at link time would add crtfastmath.o, which turns on flush-to-zero for the
    whole process on load: a request's top_p=1e-310 then read as 0 and killed the engine
   . The library is linked without it."""
    if cpu.library() is None:
        pytest.skip("the CPU kernels cannot be built here")
    tiny = float("1e-310")
    assert tiny * 1.0 != 0.0 and tiny / 2 != 0.0


def test_without_the_kernels_nothing_is_switched(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """OCTAVO_CPU_KERNELS=0, or a compiler that fails: the portable layers stay."""
    model = torch.nn.Sequential(RMSNorm(8), SiluAndMul())
    try:
        monkeypatch.setenv(kernel_build.ENABLE_ENV, "0")
        cpu.library.cache_clear()
        assert use_cpu_layers(model) == 0
        monkeypatch.setenv(kernel_build.ENABLE_ENV, "1")
        monkeypatch.setenv("CC", "/bin/false")
        # a new cache key: a fresh build
        monkeypatch.setattr(kernel_build, "HEADERS", [*kernel_build.HEADERS, Path(__file__)])
        cpu.library.cache_clear()
        assert use_cpu_layers(model) == 0
        assert "CPU kernels unavailable" in caplog.text
        assert type(model[0]) is RMSNorm and not cpu.usable(torch.ones(1, dtype=BF16))
    finally:
        monkeypatch.undo()
        cpu.library.cache_clear()
