"""The multi-LoRA shrink/expand kernels against a dense torch reference (fp64, one token at
a time) for ragged token->adapter maps with tokens that use no adapter, adapters of
several ranks zero-padded to the slots' rank, and x in fp32, fp16 and bf16."""

from __future__ import annotations

import pytest
import torch

from octavo.testing.seeds import draw_seed
from octavo_triton.kernels.lora import group_tokens_by_lora, lora_expand, lora_shrink

from .helpers import DEVICE, DTYPES

# Relative to the largest reference value: the products are exact in fp32, and what is
# left is the rounding of x and of the rank-R intermediate to the model dtype.
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def adapters(gen: torch.Generator, slots: int, max_rank: int, rows: int, cols: int,
             ranks: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``[slots, rows, cols]`` weights where slot ``i`` uses only ``ranks[i]`` of the
    ``max_rank`` rows (A) or columns (B) and the rest is zero padding."""
    weights = torch.randn(slots, rows, cols, generator=gen)
    for slot, rank in enumerate(ranks):
        if rows == max_rank:
            weights[slot, rank:] = 0
        else:
            weights[slot, :, rank:] = 0
    return weights.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shrink_then_expand_match_the_dense_reference(dtype: torch.dtype) -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    # 37 tokens over 4 slots (ranks 8, 16, 4, 16 in R=16): slot 1 has more than one token
    # block, slot 3 has none, and a third of the tokens use no adapter.
    num_tokens, in_features, rank, slots = 37, 72, 16, 4
    token_lora = torch.randint(-1, 3, (num_tokens,), generator=gen, dtype=torch.int32)
    token_lora[torch.randperm(num_tokens, generator=gen)[:18]] = 1
    x = torch.randn(num_tokens, in_features, generator=gen).to(dtype)
    lora_a = adapters(gen, slots, rank, rank, in_features, [8, 16, 4, 16], dtype)
    sizes, offsets = (40, 24), (0, 40)  # two slices of a fused projection (q and kv)
    lora_bs = [adapters(gen, slots, rank, size, rank, [8, 16, 4, 16], dtype) for size in sizes]
    y = torch.randn(num_tokens, sum(sizes), generator=gen).to(dtype)
    scale = 0.5

    want_buf = torch.zeros(num_tokens, rank, dtype=torch.float64)
    want_y = y.double()
    for t, slot in enumerate(token_lora.tolist()):
        if slot >= 0:
            want_buf[t] = scale * lora_a[slot].double() @ x[t].double()
            for lora_b, offset, size in zip(lora_bs, offsets, sizes):
                want_y[t, offset:offset + size] += lora_b[slot].double() @ want_buf[t]

    to = DEVICE
    token_lora_d = token_lora.to(to)
    buf = torch.full((num_tokens, rank), float("nan"), device=to)  # every row is written
    lora_shrink(x.to(to), lora_a.to(to), token_lora_d, buf, scale)
    torch.testing.assert_close(buf.cpu().double(), want_buf, rtol=0,
                               atol=RTOL[dtype] * float(want_buf.abs().max()),
                               msg=lambda m: f"seed {seed}, shrink: {m}")
    got_y = y.to(to)
    groups = group_tokens_by_lora(token_lora_d, slots)  # shared by the expands of a step
    for lora_b, offset, size in zip(lora_bs, offsets, sizes):
        lora_expand(got_y, buf, lora_b.to(to), token_lora_d, offset, size, groups)
    torch.testing.assert_close(got_y.cpu().double(), want_y, rtol=0,
                               atol=RTOL[dtype] * float(want_y.abs().max()),
                               msg=lambda m: f"seed {seed}, expand: {m}")
    untouched = token_lora < 0
    assert torch.equal(got_y.cpu()[untouched], y[untouched]), f"seed {seed}"


def test_grouping_and_bad_shapes() -> None:
    token_lora = torch.tensor([2, -1, 0, 2, -1, 0, 0], dtype=torch.int32)
    groups = group_tokens_by_lora(token_lora, 4)
    assert groups.sorted_tokens.tolist() == [1, 4, 2, 5, 6, 0, 3]
    assert groups.counts.tolist() == [3, 0, 2, 0]
    assert groups.starts.tolist() == [2, 5, 5, 7]
    x = torch.zeros(7, 8, device=DEVICE)
    with pytest.raises(ValueError, match="one adapter slot per token"):
        lora_shrink(x, torch.zeros(4, 16, 8, device=DEVICE), token_lora[:5].to(DEVICE),
                    torch.zeros(7, 16, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match="float32"):
        lora_shrink(x, torch.zeros(4, 16, 8, device=DEVICE), token_lora.to(DEVICE),
                    torch.zeros(7, 16, dtype=torch.float16, device=DEVICE), 1.0)
    with pytest.raises(ValueError, match="offset \\+ size"):
        lora_expand(x, torch.zeros(7, 16, device=DEVICE), torch.zeros(4, 4, 16, device=DEVICE),
                    token_lora.to(DEVICE), 6, 4)
