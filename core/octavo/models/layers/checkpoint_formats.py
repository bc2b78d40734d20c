"""How each checkpoint format stores an integer-quantized linear layer, and its unpacking into
one orientation: rows are output features, as the layers' tensor-parallel loaders expect.

The specs followed (their source files):

* AWQ, GEMM layout (AutoAWQ ``awq/modules/linear/gemm.py``, ``awq/utils/packing_utils.py``):
  ``qweight`` int32 ``[in, out / 8]``, ``qzeros`` int32 ``[groups, out / 8]``, eight 4-bit
  fields per word, lowest first, in the column order ``0 2 4 6 1 3 5 7``; ``scales``
  ``[groups, out]``; ``w = (q - z) * s``.
* GPTQ (AutoGPTQ ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``, GPTQModel's
  ``gptqmodel/nn_modules/qlinear/__init__.py``): ``qweight`` int32 ``[in * bits / 32, out]``
  packed along the input, ``qzeros`` int32 ``[groups, out * bits / 32]`` packed along the
  output, fields lowest first; ``scales`` ``[groups, out]``; ``g_idx`` int32 ``[in]``, the
  group of each input column (act-order scatters them); ``w = (q - (z + 1)) * s`` in the
  ``gptq`` checkpoint format (the stored zero is one less), ``(q - z) * s`` in ``gptq_v2``.
* compressed-tensors (``compressed_tensors/compressors/quantized_compressors/``
  ``pack_quantized.py`` and ``int_quantized.py``): ``weight_packed`` int32 ``[out, in * bits /
  32]`` packed along the input, each value stored plus ``2^(bits-1)``; ``weight_scale``
  ``[out, groups]``; ``weight_zero_point`` ``[out, groups]`` (asymmetric only);
  ``weight_g_idx`` ``[in]`` (act-order only); ``weight_shape`` ``[2]``. The int-quantized
  format (W8A8) keeps ``weight`` int8 ``[out, in]`` and a ``weight_scale`` ``[out, 1]``.

Each converter checks its tensor's dtype and shape against what the config promises and
raises ``ValueError`` naming the numbers (the loader adds the tensor's name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

from octavo.models.layers.int_weights import unpack_int32

AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # field holding natural column k of a word


class Role(Enum):
    """What a checkpoint tensor of a quantized layer holds."""

    Q = "integers"
    SCALES = "scales"
    ZEROS = "zero points"
    G_IDX = "group index"
    SHAPE = "shape"
    IGNORED = "activation quantization (read, not applied)"


@dataclass(frozen=True)
class Dims:
    """The whole (unsharded) layer or fused projection a checkpoint tensor describes."""

    rows: int  # output features
    cols: int  # input features
    groups: int


@dataclass(frozen=True)
class IntScheme:
    """An integer format as a checkpoint's ``quantization_config`` describes it."""

    layout: str  # "awq", "gptq", "ct-packed" or "ct-int"
    bits: int  # 4 or 8
    group_size: int  # -1: one group per row (per channel)
    act_order: bool = False  # a g_idx gives each column's group
    zero_points: bool = True  # zero points stored (else the format's implicit one)
    zero_offset: int = 0  # added to stored zero points (GPTQ's +1)
    static_input: bool = False  # an input_scale per layer (compressed-tensors W8A8 static)

    @property
    def tensors(self) -> dict[str, Role]:
        """The tensors of one layer, by name suffix."""
        if self.layout == "awq":
            return {"qweight": Role.Q, "qzeros": Role.ZEROS, "scales": Role.SCALES}
        if self.layout == "gptq":
            return {"qweight": Role.Q, "qzeros": Role.ZEROS, "scales": Role.SCALES,
                    "g_idx": Role.G_IDX}
        if self.layout == "ct-int":
            names = {"weight": Role.Q, "weight_scale": Role.SCALES}
            return names | ({"input_scale": Role.IGNORED} if self.static_input else {})
        names = {"weight_packed": Role.Q, "weight_scale": Role.SCALES,
                 "weight_shape": Role.SHAPE}
        if self.zero_points:
            names["weight_zero_point"] = Role.ZEROS
        if self.act_order:
            names["weight_g_idx"] = Role.G_IDX
        return names

    @property
    def implicit_zero(self) -> int:
        """The zero point of a symmetric format that stores none, in the unsigned range the
        converters return (compressed-tensors' values are stored signed, shifted here)."""
        return 1 << (self.bits - 1) if self.layout == "ct-packed" else 0

    def convert(self, role: Role, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
        """``loaded`` as ``[rows, cols]`` int16 integers or ``[rows, groups]`` fp32 scales /
        zero points (``g_idx`` and shapes are checked by the method)."""
        return _CONVERTERS[(self.layout, role)](self, loaded, dims)


def expect(loaded: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
           what: str) -> None:
    """ValueError naming the difference where ``loaded`` is not ``shape`` of ``dtypes``."""
    if tuple(loaded.shape) != shape:
        raise ValueError(f"{what}: expected shape {list(shape)} from the quantization "
                         f"config, the checkpoint has {list(loaded.shape)}")
    if loaded.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{what}: expected {names}, the checkpoint has "
                         f"{str(loaded.dtype).removeprefix('torch.')}")


FLOATS = (torch.float16, torch.bfloat16, torch.float32)
INT32 = (torch.int32,)


def _packed(scheme: IntScheme, size: int, what: str) -> int:
    per_word = 32 // scheme.bits
    if size % per_word:
        raise ValueError(f"{what}: {size} values do not pack into whole int32 words of "
                         f"{per_word}")
    return size // per_word


def _awq_unpack(scheme: IntScheme, loaded: torch.Tensor, rows: int, lead: int,
                what: str) -> torch.Tensor:
    expect(loaded, (lead, _packed(scheme, rows, what)), INT32, what)
    fields = unpack_int32(loaded, scheme.bits, 1).view(lead, -1, 8)
    return fields[..., list(AWQ_REVERSE_ORDER)].reshape(lead, rows).T.contiguous()


def _awq_q(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    return _awq_unpack(scheme, loaded, dims.rows, dims.cols, "AWQ qweight")


def _awq_zeros(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    return _awq_unpack(scheme, loaded, dims.rows, dims.groups, "AWQ qzeros").float()


def _scales_by_group(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    """``scales [groups, out]`` (AWQ, GPTQ) as ``[out, groups]``."""
    expect(loaded, (dims.groups, dims.rows), FLOATS, f"{scheme.layout} scales")
    return loaded.T.float().contiguous()


def _gptq_q(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    what = "GPTQ qweight"
    expect(loaded, (_packed(scheme, dims.cols, what), dims.rows), INT32, what)
    return unpack_int32(loaded, scheme.bits, 0).T.contiguous()


def _gptq_zeros(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    what = "GPTQ qzeros"
    expect(loaded, (dims.groups, _packed(scheme, dims.rows, what)), INT32, what)
    return unpack_int32(loaded, scheme.bits, 1).T.float() + scheme.zero_offset


def _ct_packed_q(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    what = "compressed-tensors weight_packed"
    expect(loaded, (dims.rows, _packed(scheme, dims.cols, what)), INT32, what)
    return unpack_int32(loaded, scheme.bits, 1)


def _ct_int_q(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    expect(loaded, (dims.rows, dims.cols), (torch.int8,), "compressed-tensors int8 weight")
    return loaded.to(torch.int16)


def _ct_scales(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    expect(loaded, (dims.rows, dims.groups), FLOATS, "compressed-tensors weight_scale")
    return loaded.float()


def _ct_zeros(scheme: IntScheme, loaded: torch.Tensor, dims: Dims) -> torch.Tensor:
    expect(loaded, (dims.rows, dims.groups), (torch.int8, torch.int32),
           "compressed-tensors weight_zero_point")
    return loaded.float() + scheme.implicit_zero


Converter = Callable[[IntScheme, torch.Tensor, Dims], torch.Tensor]
_CONVERTERS: dict[tuple[str, Role], Converter] = {
    ("awq", Role.Q): _awq_q, ("awq", Role.ZEROS): _awq_zeros,
    ("awq", Role.SCALES): _scales_by_group,
    ("gptq", Role.Q): _gptq_q, ("gptq", Role.ZEROS): _gptq_zeros,
    ("gptq", Role.SCALES): _scales_by_group,
    ("ct-packed", Role.Q): _ct_packed_q, ("ct-packed", Role.SCALES): _ct_scales,
    ("ct-packed", Role.ZEROS): _ct_zeros,
    ("ct-int", Role.Q): _ct_int_q, ("ct-int", Role.SCALES): _ct_scales,
}
