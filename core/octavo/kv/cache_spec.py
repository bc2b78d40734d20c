"""KV specs and KV groups: which layers share block tables (vLLM's hybrid KV cache layout),
and the layers that keep a per-request state instead (``SSMStateSpec``).

Every attention layer declares a spec - full attention, or a sliding window of N tokens.
Layers with one spec form a group with its own manager and block tables, so sliding-window
layers can give back the blocks their window no longer covers while full-attention layers
keep every block.

One pool of block ids serves every group. When the specs have unequal layer counts, each
spec's layers are split so every group holds the same number of layers,
``layers_per_group`` (vLLM's rule), and layer ``j`` of every group uses KV tensor ``j``: a
block id then stands for one page in each of ``layers_per_group`` tensors, and belongs to
exactly one group at a time. A model whose layers all have one spec is one group, with a
tensor per layer - exactly the layout without groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Use the larger layer count as the group size when it is less than this many times the
# smaller: a few padding tensors cost less than splitting into more groups (vLLM's rule).
PADDING_TOLERANCE = 1.25


@dataclass(frozen=True)
class FullAttentionSpec:
    """A layer attending every earlier token: it needs every block of the request."""

    def describe(self) -> str:
        return "full attention"


@dataclass(frozen=True)
class SlidingWindowSpec:
    """A layer attending the last ``sliding_window`` tokens (itself included)."""

    sliding_window: int

    def __post_init__(self) -> None:
        if self.sliding_window < 1:
            raise ValueError(f"a sliding window must be at least 1 token, "
                             f"got {self.sliding_window}")

    def describe(self) -> str:
        return f"sliding window {self.sliding_window}"


KVCacheSpec = FullAttentionSpec | SlidingWindowSpec


@dataclass(frozen=True)
class MLASpec:
    """A multi-head latent attention layer (DeepSeek-V2/V3): each token keeps one latent of
    ``kv_lora_rank + qk_rope_head_dim`` values for all its heads - the compressed keys and
    values and the rotated key part - instead of a key and a value per KV head. Its blocks
    are allocated as full attention's (every token needs its slot); only the page differs,
    which is what the KV budget buys: ``page_bytes`` a block."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def page_bytes(self, block_size: int, dtype_bytes: int) -> int:
        """One layer's page of one block."""
        return block_size * self.latent_dim * dtype_bytes

    def describe(self) -> str:
        return (f"multi-head latent attention, {self.kv_lora_rank} + {self.qk_rope_head_dim} "
                "values per token")


# A layer's entry in a model's per-layer KV specs (``CausalLM.layer_kv_specs``, what a worker's
# ``get_kv_cache_spec`` reports) for a layer with a per-request state instead of a KV cache.
SSM_LAYER = "ssm"
# Per layer: an attention window (None: full attention) or SSM_LAYER.
LayerSpecs = Sequence[int | str | None]


@dataclass(frozen=True)
class SSMStateSpec:
    """Layers with a fixed-size state per request, not per token (Mamba's convolution inputs
    and selective-scan state): each running request holds one slot of a pool
    (``octavo.kv.state_pool``) across all of them, from its first allocation until it is
    freed. They take no KV blocks and stay out of the KV groups."""

    layers: tuple[int, ...]

    def describe(self) -> str:
        return f"SSM state per request, layers {', '.join(map(str, self.layers))}"


def ssm_state_spec(specs: LayerSpecs) -> SSMStateSpec | None:
    """The SSM layers of a model's per-layer specs, None when it has none."""
    layers = tuple(i for i, spec in enumerate(specs) if spec == SSM_LAYER)
    return SSMStateSpec(layers) if layers else None


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers (model-wide indices, ascending) with one spec; ``layers[j]`` uses KV tensor j."""

    spec: KVCacheSpec
    layers: tuple[int, ...]


def layer_spec(sliding_window: int | None) -> KVCacheSpec:
    return FullAttentionSpec() if sliding_window is None else SlidingWindowSpec(sliding_window)


def kv_cache_groups(specs: LayerSpecs) -> list[KVCacheGroup]:
    """The groups of a model whose layer ``i`` has window ``specs[i]`` (None: full
    attention), full attention first; SSM layers (``SSM_LAYER``) hold no KV cache and are in
    none. An empty sequence, or one of SSM layers only, means one full-attention group."""
    by_spec: dict[KVCacheSpec, list[int]] = {}
    for layer, window in enumerate(specs):
        if not isinstance(window, str):  # SSM_LAYER, the one spec that is a string
            by_spec.setdefault(layer_spec(window), []).append(layer)
    if not by_spec:
        return [KVCacheGroup(FullAttentionSpec(), ())]
    if len(by_spec) == 1:
        ((spec, layers),) = by_spec.items()
        return [KVCacheGroup(spec, tuple(layers))]
    counts = [len(layers) for layers in by_spec.values()]
    size = max(counts) if max(counts) < min(counts) * PADDING_TOLERANCE else min(counts)
    order = sorted(by_spec, key=lambda spec: isinstance(spec, SlidingWindowSpec))
    return [KVCacheGroup(spec, tuple(by_spec[spec][start:start + size]))
            for spec in order for start in range(0, len(by_spec[spec]), size)]


def layers_per_group(groups: Sequence[KVCacheGroup]) -> int:
    """KV tensors a block id spans: the largest group's layer count."""
    return max(len(group.layers) for group in groups)


def tensor_of_layer(groups: Sequence[KVCacheGroup]) -> dict[int, int]:
    """Model-wide layer index -> the KV tensor it writes (its place in its group)."""
    return {layer: j for group in groups for j, layer in enumerate(group.layers)}


def is_hybrid(groups: Sequence[KVCacheGroup]) -> bool:
    """Whether the groups need the coordinator: several groups, or one sliding-window one."""
    return len(groups) > 1 or isinstance(groups[0].spec, SlidingWindowSpec)


def max_blocks_per_request(groups: Sequence[KVCacheGroup], num_tokens: int, block_size: int,
                           max_chunk: int) -> int:
    """The most blocks one request of ``num_tokens`` tokens holds at once, over all groups,
    when it is computed in chunks of at most ``max_chunk`` tokens: a sliding-window group
    holds its window before the chunk, and the chunk."""
    full = -(-num_tokens // block_size)
    total = 0
    for group in groups:
        spec = group.spec
        if isinstance(spec, SlidingWindowSpec):
            span = spec.sliding_window - 1 + min(max_chunk, num_tokens)
            total += min(full, -(-span // block_size) + 1)
        else:
            total += full
    return total


def describe_groups(groups: Sequence[KVCacheGroup]) -> str:
    return "; ".join(f"group {i}: {group.spec.describe()}, layers "
                     f"{', '.join(map(str, group.layers))}" for i, group in enumerate(groups))
