"""Random GGUF quantized blocks for tests and benchmarks: random bytes for the quants, with
sane finite fp16 scales (and minimums) written into each block's scale fields.

Why not random bytes alone: a random fp16 scale is now and then inf, NaN or subnormal, which
a real file's never is; the kernels need not (and do not) check for them on the hot path.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GgmlType

# Byte offsets of each type's fp16 fields in a block: (scale, minimum or None), from
# llama.cpp's ggml-common.h block structs.
SCALE_FIELDS = {
    GgmlType.Q4_0: (0, None), GgmlType.Q4_1: (0, 2), GgmlType.Q5_0: (0, None),
    GgmlType.Q5_1: (0, 2), GgmlType.Q8_0: (0, None), GgmlType.IQ4_NL: (0, None),
    GgmlType.Q2_K: (80, 82), GgmlType.Q3_K: (108, None), GgmlType.Q4_K: (0, 2),
    GgmlType.Q5_K: (0, 2), GgmlType.Q6_K: (208, None),
}


def random_blocks(ggml_type: GgmlType, rows: int, in_features: int,
                  gen: np.random.Generator) -> np.ndarray:
    """A [rows, in_features] weight of ``ggml_type`` as uint8 [rows, row bytes]: scales of
    magnitude 2e-3..2e-2 and random sign, minimums in +-2e-2."""
    elems, size = GGML_QUANT_SIZES[ggml_type]
    if in_features % elems:
        raise ValueError(f"{ggml_type.name} rows are whole blocks of {elems} values, "
                         f"not {in_features}")
    blocks = gen.integers(0, 256, (rows * in_features // elems, size), dtype=np.uint8)
    scale, minimum = SCALE_FIELDS[ggml_type]
    n = blocks.shape[0]
    sign = gen.choice(np.array([-1.0, 1.0]), n)
    d = np.asarray(gen.uniform(2e-3, 2e-2, size=n) * sign, dtype=np.float16)
    blocks[:, scale:scale + 2] = d.view(np.uint8).reshape(n, 2)
    if minimum is not None:
        m = np.asarray(gen.uniform(-2e-2, 2e-2, size=n), dtype=np.float16)
        blocks[:, minimum:minimum + 2] = m.view(np.uint8).reshape(n, 2)
    return blocks.reshape(rows, -1)
