"""A checkpoint's per-layer fp8 KV-cache scales, read as vLLM reads them
(``maybe_remap_kv_scale_name``): ``model.layers.N.self_attn.k_scale`` / ``v_scale``
(llm-compressor, compressed-tensors), ModelOpt's ``self_attn.k_proj.k_scale`` /
``self_attn.v_proj.v_scale``, and the deprecated ``self_attn.kv_scale``, one scale for both.

They are not parameters: each one-element tensor becomes its layer's
``AttentionImpl.k_scale`` / ``v_scale`` (``octavo.attention.kv_quant``), used only by an fp8
KV cache. A layer without them keeps 1.0, vLLM's default. ``--calculate-kv-scales`` has
every layer measure its own instead (:func:`calculate_kv_scales`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from octavo.attention.base import AttentionImpl
from octavo.models.base import WeightLoadError
from octavo.models.loader.quantized import Weight

SCALE_NAME = re.compile(
    r"^(?P<layer>.*\.layers\.\d+)\.self_attn\."
    r"(?:(?:k_proj\.)?(?P<k>k_scale)|(?:v_proj\.)?(?P<v>v_scale)|(?P<kv>kv_scale))$")


def take_kv_scales(weights: Iterable[tuple[str, Weight]],
                   scales: dict[str, tuple[str, float]]) -> Iterator[tuple[str, Weight]]:
    """``weights`` less the KV-cache scales, which go into ``scales``: the checkpoint's name
    -> (which scale, its value)."""
    for name, tensor in weights:
        match = SCALE_NAME.match(name)
        if match is None:
            yield name, tensor
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            raise WeightLoadError(name, "a KV-cache scale must be one number, got shape "
                                        f"{tuple(getattr(tensor, 'shape', ()))}")
        value = float(tensor.float())
        if not value > 0.0 or value == float("inf"):
            raise WeightLoadError(name, f"a KV-cache scale must be positive and finite, "
                                        f"got {value}")
        which = "k" if match["k"] else "v" if match["v"] else "kv"
        scales[name] = (which, value)


def apply_kv_scales(model: nn.Module, scales: dict[str, tuple[str, float]]) -> None:
    """Set each scale on its layer's attention impl; a layer of another pipeline stage is
    skipped, a scale with no attention layer to take it refused naming the tensor."""
    for name, (which, value) in scales.items():
        match = SCALE_NAME.match(name)
        assert match is not None
        impl = _layer_impl(model, match["layer"], name)
        if impl is None:
            continue
        if which in ("k", "kv"):
            impl.k_scale = value
        if which in ("v", "kv"):
            impl.v_scale = value


def calculate_kv_scales(model: nn.Module) -> None:
    """vLLM's ``--calculate-kv-scales``: every attention layer of ``model`` takes its scales
    from the first keys and values it stores (``AttentionImpl.maybe_calc_kv_scales``),
    over the checkpoint's."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, AttentionImpl):
                value.calculate_kv_scales = True


def _layer_impl(model: nn.Module, layer: str, name: str) -> AttentionImpl | None:
    try:
        module = model.get_submodule(layer)
    except AttributeError:
        raise WeightLoadError(name, f"unexpected: {type(model).__name__} has no layer "
                                    f"{layer}") from None
    impls = [value for sub in module.modules() for value in vars(sub).values()
             if isinstance(value, AttentionImpl)]
    if not impls and not list(module.parameters()):
        return None  # another pipeline stage's layer (a placeholder)
    if len(impls) != 1:
        raise WeightLoadError(name, f"{layer} has {len(impls)} attention layers to take it")
    return impls[0]
