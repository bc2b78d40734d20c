"""The worker side of KV groups (``octavo.kv.cache_spec``): the model's per-layer specs, the KV
tensors a block id spans, and each attention layer told which group it is in."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from octavo.attention.base import AttentionImpl
from octavo.attention.kv_groups import KVGroupAttention
from octavo.kv.cache_spec import KVCacheGroup, tensor_of_layer


def layer_kv_specs(model: nn.Module) -> list[int | str | None]:
    """Each layer's spec, model-wide (``CausalLM.layer_kv_specs``: its sliding window, None
    for full attention, or ``SSM_LAYER``); every layer full attention for a model that
    does not say."""
    specs = getattr(model, "layer_kv_specs", None)
    return specs() if specs is not None else []


def local_tensor_indices(groups: Sequence[KVCacheGroup], layers: Sequence[int]) -> list[int]:
    """For each of this rank's ``layers``, its KV tensor among this rank's tensors."""
    by_layer = tensor_of_layer(groups)
    used = sorted({by_layer[layer] for layer in layers})
    return [used.index(by_layer[layer]) for layer in layers]


def assign_kv_groups(model: nn.Module, groups: Sequence[KVCacheGroup],
                     layers: Sequence[int]) -> None:
    """Wrap each attention layer's impl (found in module order: one per decoder layer, in
    layer order) so it attends with its group's metadata. Refuses a model whose impls do
    not line up with its layers, or whose impl windows disagree with the groups' specs."""
    group_of = {layer: g for g, group in enumerate(groups) for layer in group.layers}
    found = [(module, name, value) for module in model.modules()
             for name, value in list(vars(module).items())
             if isinstance(value, AttentionImpl)]
    if len(found) != len(layers):
        raise ValueError(f"{type(model).__name__}: found {len(found)} attention layers for "
                         f"{len(layers)} decoder layers, so their KV groups are unknown")
    for layer, (module, name, impl) in zip(layers, found):
        if isinstance(impl, KVGroupAttention):  # a cache allocated again: wrap afresh
            impl = impl.impl
        group = groups[group_of[layer]]
        window = getattr(group.spec, "sliding_window", None)
        if impl.sliding_window != window:
            raise ValueError(f"{type(model).__name__}: layer {layer} attends with window "
                             f"{impl.sliding_window}, but its KV group is "
                             f"{group.spec.describe()}")
        setattr(module, name, KVGroupAttention(impl, group_of[layer]))
