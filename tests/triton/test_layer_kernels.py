"""RMSNorm (+ residual), rotary embedding and SiLU-and-mul kernels against the portable
layers of the core, which are their reference: same inputs, same parameters.

The kernels round to the model dtype where the layers do, so the results agree to one unit
in the last place (the only difference left is the order of a sum).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo.models.config import RopeConfig
from octavo.models.layers.activation import SiluAndMul
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.activation import silu_and_mul
from octavo_triton.kernels.rms_norm import rms_norm
from octavo_triton.kernels.rotary import rotary_embedding

from .helpers import DEVICE, DTYPES

# Two units in the last place of each dtype, relative (the formula of a SiLU or the order
# of a sum may differ by one before the last rounding).
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}
LLAMA3_ROPE = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=8192)


def assert_matches(got: torch.Tensor, want: torch.Tensor, seed: int, atol: float = 1e-5) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL[want.dtype], atol=atol,
                               msg=lambda m: f"seed {seed}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 96), (3, 4096), (5, 4, 32)],
                         ids=["hidden96", "hidden4096", "per-head"])
def test_rms_norm(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE)
    residual = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    layer = RMSNorm(shape[-1], eps=1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        layer.weight.copy_(1 + 0.3 * torch.randn(shape[-1], generator=gen))

        assert_matches(rms_norm(x, layer.weight, 1e-5), layer(x), seed)
        got, got_sum = rms_norm(x, layer.weight, 1e-5, residual)
        want, want_sum = layer(x, residual)
    assert_matches(got, want, seed)
    assert torch.equal(got_sum, want_sum), f"seed {seed}: the residual sum differs"


@pytest.mark.parametrize(("dtype", "head_dim", "num_heads", "num_kv_heads"), [
    (torch.float32, 64, 8, 8),
    (torch.float16, 128, 8, 2),
    (torch.bfloat16, 256, 4, 1),
    (torch.bfloat16, 128, 12, 4),
])
def test_rotary_embedding(dtype: torch.dtype, head_dim: int, num_heads: int,
                          num_kv_heads: int) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    num_tokens = 9
    # q and k are views into one fused projection, as the attention layer passes them.
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen).to(dtype).to(DEVICE)
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, 40000, (num_tokens,), generator=gen).to(DEVICE)
    rope = RotaryEmbedding(head_dim, LLAMA3_ROPE).to(DEVICE)

    got_q, got_k = rotary_embedding(positions, q, k, rope.inv_freq)
    want_q, want_k = rope(positions, q, k)
    # An output near zero is the difference of two terms as large as the inputs (x1 cos -
    # x2 sin), and at positions in the tens of thousands the two cos/sin implementations
    # differ in the angle's last bits: so the absolute tolerance is two units in the last
    # place of the inputs' magnitude, not of the output's (seed 883398947 in fp16 differed
    # by 2.4e-4 at an output of 3e-3, with inputs near 4).
    atol = RTOL[dtype] * float(qkv.abs().max())
    assert_matches(got_q, want_q, seed, atol)
    assert_matches(got_k, want_k, seed, atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [40, 2500])  # one partial block; several column blocks
def test_silu_and_mul(dtype: torch.dtype, d: int) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, 3, 2 * d, generator=gen) * 4).to(dtype).to(DEVICE)
    assert_matches(silu_and_mul(x), SiluAndMul()(x), seed)
    gate, up = x.float().chunk(2, dim=-1)
    assert silu_and_mul(x).shape == (2, 3, d)
    torch.testing.assert_close(silu_and_mul(x).float(), F.silu(gate) * up,
                               rtol=2 * RTOL[dtype], atol=1e-5)


def test_bad_shapes_are_named() -> None:
    x = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight .* hidden size 8"):
        rms_norm(x, torch.ones(6, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="even last dimension"):
        silu_and_mul(torch.zeros(2, 7, device=DEVICE))
    q = torch.zeros(1, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="inv_freq"):
        rotary_embedding(torch.zeros(1, dtype=torch.int64, device=DEVICE), q, q,
                         torch.ones(3, device=DEVICE))
