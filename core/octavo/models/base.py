"""``CausalLM``: what every model implementation offers the model runner and the loader.

The runner calls ``forward`` on the flattened tokens of a step and ``compute_logits`` on the
hidden states it wants logits for, and sizes the KV cache from ``num_layers``,
``num_kv_heads`` and ``head_dim``. The loader streams HF-named tensors into
``load_weights``.

Weight names: a model's parameters are named as in HF checkpoints except where several HF
tensors are fused into one parameter. ``stacked_params`` lists those fusions as
``(fused name fragment, HF name fragment, shard id)``, e.g. ``(".qkv_proj.", ".k_proj.",
"k")``: the HF tensor ``...k_proj.weight`` is shard ``"k"`` of the parameter
``...qkv_proj.weight``. Models with other fusions override :meth:`param_for` and
:meth:`hf_names_for`, which must stay each other's inverse.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager
from typing import ClassVar

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.models.config import ArchConfig
from octavo.models.layers.embedding import ParallelLMHead
from octavo.models.layers.weights import default_weight_loader

# Checkpoint tensors that are not parameters: buffers that old checkpoints saved.
IGNORED_WEIGHT_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """An HF weight could not be loaded; ``weight_name`` is its checkpoint name."""

    def __init__(self, weight_name: str, problem: str) -> None:
        super().__init__(f"weight {weight_name!r}: {problem}")
        self.weight_name = weight_name
        self.problem = problem


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Create tensors in ``dtype`` by default, so parameters are allocated once, directly in
    the model's dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class CausalLM(nn.Module):
    """Base class of decoder-only language models. Subclasses build their layers in
    ``__init__`` (inside ``default_dtype(dtype)``), set ``self.lm_head`` and implement
    ``forward``."""

    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = ()
    lm_head: ParallelLMHead

    def __init__(
        self, config: ArchConfig, attn_backend: type[AttentionBackend], dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.dtype = dtype

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    def forward(
        self,
        input_ids: torch.Tensor,  # int64 [T]
        positions: torch.Tensor,  # int64 [T]
        kv_caches: list[torch.Tensor],  # one per layer, attn_backend.kv_cache_shape(...)
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden_size]
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[N, vocab_size]`` for hidden states ``[N, hidden_size]``."""
        return self.lm_head.compute_logits(hidden)

    # -- weights ---------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into the parameters; returns the HF names loaded.

        Raises :class:`WeightLoadError` for a tensor the model has no place for or whose
        shape is wrong.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if self.ignores_weight(hf_name):
                continue
            param_name, shard_id = self.param_for(hf_name)
            param = params.get(param_name)
            if param is None:
                raise WeightLoadError(hf_name, f"unexpected: {type(self).__name__} has no "
                                               f"parameter for it")
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                weight_loader(param, tensor, shard_id)
            except ValueError as exc:  # WeightShapeError or a bad shard id
                raise WeightLoadError(hf_name, str(exc)) from exc
            loaded.add(hf_name)
        return loaded

    def missing_weights(self, loaded: set[str]) -> list[str]:
        """HF names of the weights the model needs that are not in ``loaded``."""
        return [hf_name for param_name, _ in self.named_parameters()
                for hf_name in self.hf_names_for(param_name) if hf_name not in loaded]

    def ignores_weight(self, hf_name: str) -> bool:
        """Checkpoint tensors to skip: saved buffers, and the LM head of tied models (some
        checkpoints store a copy of the embedding there)."""
        if hf_name.endswith(IGNORED_WEIGHT_SUFFIXES):
            return True
        return self.config.tie_word_embeddings and hf_name == "lm_head.weight"

    def param_for(self, hf_name: str) -> tuple[str, object]:
        """The parameter an HF tensor loads into and its shard id (None: the whole)."""
        for fused, part, shard_id in self.stacked_params:
            if part in hf_name:
                return hf_name.replace(part, fused), shard_id
        return hf_name, None

    def hf_names_for(self, param_name: str) -> list[str]:
        """The HF tensors that together fill a parameter."""
        parts = [param_name.replace(fused, part)
                 for fused, part, _ in self.stacked_params if fused in param_name]
        return parts or [param_name]
