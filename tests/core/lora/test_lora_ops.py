"""The CPU shrink/expand pair against a dense torch reference, on ragged token -> slot
maps with tokens of no adapter, and a packed layer's slices at their offsets."""

from __future__ import annotations

import torch

from octavo.lora.ops import lora_expand, lora_shrink
from octavo.testing.seeds import draw_seed


def reference(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_lora: torch.Tensor,
              scale: float) -> torch.Tensor:
    """Token by token: ``scale * b[s] @ a[s] @ x[t]`` (0 for s = -1), float64."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for t, slot in enumerate(token_lora.tolist()):
        if slot >= 0:
            out[t] = scale * b[slot].double() @ (a[slot].double() @ x[t].double())
    return out


def test_shrink_expand_match_dense_reference() -> None:
    seed = draw_seed()
    generator = torch.Generator().manual_seed(seed)
    slots, rank, inp, sizes = 3, 16, 48, [32, 8, 8]
    x = torch.randn(37, inp, generator=generator)
    # Ragged: runs of every slot, lone tokens, tokens with no adapter, a slot never used.
    token_lora = torch.tensor([0] * 5 + [-1] * 3 + [2] * 11 + [0] + [-1] + [2] * 16,
                              dtype=torch.int32)
    y = torch.randn(37, sum(sizes), generator=generator)
    expected = y.double().clone()
    buf = torch.empty(37, rank)
    offset = 0
    for size in sizes:  # a packed projection: one shrink/expand per slice
        a = torch.randn(slots, rank, inp, generator=generator)
        b = torch.randn(slots, size, rank, generator=generator)
        lora_shrink(x, a, token_lora, buf, 0.5)
        assert torch.all(buf[token_lora < 0] == 0), f"seed {seed}"
        lora_expand(y, buf, b, token_lora, offset, size)
        expected[:, offset:offset + size] += reference(x, a, b, token_lora, 0.5)
        offset += size
    assert torch.allclose(y.double(), expected, atol=1e-4, rtol=1e-5), f"seed {seed}"
