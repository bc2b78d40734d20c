"""Our GGUF dequantizers against gguf's reference (gguf.quants.dequantize) on fresh random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as GgmlType

from octavo.models.loader.dequant import FLOAT_TYPES, SUPPORTED_TYPES, dequantize
from octavo.testing.seeds import draw_seed
from tests.core.loader_helpers import random_raw

TYPES = sorted(SUPPORTED_TYPES, key=lambda t: t.value)


def test_supported_types_are_the_briefed_ones() -> None:
    names = {t.name for t in SUPPORTED_TYPES}
    # Q5_0 (and its sibling Q5_1): the Gemma 3 270M Q4_K_M file holds Q5_0 tensors.
    assert names == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                     "Q6_K"}


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_reference_bit_exactly(ggml_type: GgmlType) -> None:
    seed = draw_seed()
    rng = np.random.default_rng(seed)
    block_elems = GGML_QUANT_SIZES[ggml_type][0]
    # Several rows of several blocks, plus an odd row count, so row/block order matters.
    shape = (7, 3 * max(block_elems, 32))
    raw = random_raw(ggml_type, shape, rng)

    ours = dequantize(raw, ggml_type, shape)
    reference = torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, ggml_type)))

    assert ours.dtype == FLOAT_TYPES.get(ggml_type, torch.float32), f"seed={seed}"
    assert ours.shape == shape, f"seed={seed}"
    assert reference.isfinite().all(), f"seed={seed}: random data produced non-finite values"
    assert torch.equal(ours.float(), reference.reshape(shape)), (
        f"seed={seed}: {ggml_type.name} max diff "
        f"{(ours.float() - reference.reshape(shape)).abs().max().item()}"
    )


def test_dequantize_decodes_large_tensors_in_chunks_identically() -> None:
    """More blocks than one decoding chunk: the chunk seams must not shift any value."""
    from octavo.models.loader import dequant

    seed = draw_seed()
    raw = random_raw(GgmlType.Q4_K, (dequant.CHUNK_BLOCKS + 5, 256), np.random.default_rng(seed))
    ours = dequantize(raw, GgmlType.Q4_K, (dequant.CHUNK_BLOCKS + 5, 256))
    reference = torch.from_numpy(quants.dequantize(raw, GgmlType.Q4_K))
    assert torch.equal(ours, reference), f"seed={seed}"


def test_unsupported_type_is_refused() -> None:
    raw = np.zeros((1, GGML_QUANT_SIZES[GgmlType.Q5_K][1]), dtype=np.uint8)
    with pytest.raises(ValueError, match="Q5_K"):
        dequantize(raw, GgmlType.Q5_K, (1, 256))
