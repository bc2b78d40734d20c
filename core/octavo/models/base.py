"""``CausalLM``: what every model implementation offers the model runner and the loader.

The runner calls ``forward`` on the flattened tokens of a step and ``compute_logits`` on the
hidden states it wants logits for, and sizes the KV cache from ``num_layers``,
``num_kv_heads`` and ``head_dim`` - this rank's share of them under tensor and pipeline
parallelism. The loader streams HF-named tensors into ``load_weights``.

Pipeline parallelism: a model that supports it (``supports_pp``) builds only its stage's
layers and puts a ``PPMissingLayer`` where the others (and the embedding, final norm or LM
head a stage does without) would be, so parameter names stay HF's; ``load_weights`` skips
the checkpoint tensors of missing modules. A stage before the last returns
``IntermediateTensors`` instead of hidden states, and a stage after the first is given them.

The decoder stack: a model keeps its layers, token embedding and final norm in ``model``
(a ``DecoderStack``, e.g. ``LlamaModel``); speculative decoding's EAGLE heads share the
embedding and norm and draft from the hidden states the stack keeps on request. A model
without one runs, but not with those heads.

Weight names: a model's parameters are named as in HF checkpoints except where several HF
tensors are fused into one parameter. ``stacked_params`` lists those fusions as
``(fused name fragment, HF name fragment, shard id)``, e.g. ``(".qkv_proj.", ".k_proj.",
"k")``: the HF tensor ``...k_proj.weight`` is shard ``"k"`` of the parameter
``...qkv_proj.weight``. Models with other fusions override :meth:`param_for` and
:meth:`hf_names_for`, which must stay each other's inverse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.distributed.state import RankInfo, get_parallel_state
from octavo.kv.cache_spec import MLASpec
from octavo.models.config import ArchConfig
from octavo.models.layers.embedding import ParallelLMHead
from octavo.models.layers.norm import RMSNorm
from octavo.models.layers.parallel import kv_head_shards
from octavo.models.layers.weights import default_weight_loader
from octavo.models.loader.quantized import GgufTensor, Weight

# Checkpoint tensors that are not parameters: buffers that old checkpoints saved.
IGNORED_WEIGHT_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    """An HF weight could not be loaded; ``weight_name`` is its checkpoint name."""

    def __init__(self, weight_name: str, problem: str) -> None:
        super().__init__(f"weight {weight_name!r}: {problem}")
        self.weight_name = weight_name
        self.problem = problem


@dataclass
class IntermediateTensors:
    """What one pipeline stage hands the next: the hidden states and the residual stream."""

    hidden: torch.Tensor  # [T, hidden_size]
    residual: torch.Tensor  # [T, hidden_size]

    def as_list(self) -> list[torch.Tensor]:
        return [self.hidden, self.residual]


class PPMissingLayer(nn.Module):
    """Stands where a module of another pipeline stage would be; it holds nothing."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("a module of another pipeline stage was called")


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The decoder layers of stage ``pp_rank``: an even split, the stages just before the
    last taking one more each when it does not divide (the last also runs the LM head)."""
    if num_layers < pp_size:
        raise ValueError(f"{num_layers} layers cannot be split into {pp_size} pipeline stages")
    sizes = [num_layers // pp_size] * pp_size
    for i in range(num_layers % pp_size):
        sizes[-2 - i] += 1
    start = sum(sizes[:pp_rank])
    return range(start, start + sizes[pp_rank])


class DecoderStack(Protocol):
    """``CausalLM.model``: what speculative decoding reads from a model's decoder stack and
    sets on it (``LlamaModel`` has it all)."""

    @property
    def embed_tokens(self) -> nn.Module: ...  # the token embedding (the first stage's)

    @property
    def norm(self) -> RMSNorm | PPMissingLayer: ...  # the final norm (the last stage's)

    # Set: forward keeps its output before the final norm in ``prenorm_hidden``.
    keep_prenorm_hidden: bool
    prenorm_hidden: torch.Tensor | None
    # The layers whose input forward keeps in ``aux_hidden_states``, in layer order.
    aux_hidden_state_layers: frozenset[int]
    aux_hidden_states: list[torch.Tensor]


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
    """Base class of the models the runners run: decoder-only language models, and
    encoder-only models (``encoder_only``). Subclasses build their layers in ``__init__``
    (inside ``default_dtype(dtype)``), set ``self.lm_head`` (decoders) and implement
    ``forward``."""

    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = ()
    # Whether the model builds only its pipeline stage's layers (see the module docstring);
    # one that does not runs with one stage only.
    supports_pp: ClassVar[bool] = False
    # Whether the model runs with Ulysses sequence parallelism: its stack computes a slice
    # of the step's tokens and its attention trades tokens for heads around the backend
    # (``octavo.models.layers.sequence_parallel``; the Llama family's dense models do).
    supports_sp: ClassVar[bool] = False
    # The config's hidden_act values the model's MLP computes; any other is refused.
    activations: ClassVar[tuple[str, ...]] = ("silu",)
    # An encoder (BERT): bidirectional attention over each prompt, computed whole in one
    # step, so it needs no KV cache and has no LM head; only the pooling runner runs it.
    encoder_only: ClassVar[bool] = False
    model: DecoderStack  # see the module docstring
    lm_head: ParallelLMHead | PPMissingLayer

    def __init__(
        self, config: ArchConfig, attn_backend: type[AttentionBackend], dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.dtype = dtype
        # This process's ranks, fixed when the model is built (its layers shard by them).
        self.ranks: RankInfo = get_parallel_state().info
        if config.hidden_act not in self.activations:
            raise ValueError(f"{type(self).__name__} does not support the activation "
                             f"(hidden_act) {config.hidden_act!r} (supported: "
                             f"{', '.join(self.activations)})")
        if self.ranks.pp_size > 1 and not self.supports_pp:
            raise ValueError(f"{type(self).__name__} does not support pipeline parallelism")
        if self.ranks.sp_size > 1 and not self.supports_sp:
            raise ValueError(f"{type(self).__name__} does not support sequence parallelism")
        self.layer_range = pp_layer_range(config.num_hidden_layers, self.ranks.pp_rank,
                                          self.ranks.pp_size)

    @property
    def num_layers(self) -> int:
        """Decoder layers on this rank (its pipeline stage's), one KV cache each."""
        return len(self.layer_range)

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads on this rank (its tensor-parallel share, of which a sequence
        rank holds its own slice)."""
        return kv_head_shards(self.config.num_key_value_heads, self.ranks.tp_rank,
                              self.ranks.tp_size)[0] // self.ranks.sp_size

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def mla_spec(self) -> MLASpec | None:
        """The latent a multi-head latent attention model caches per token (its layers'
        ``MLAImpl``), None for key/value heads."""
        return None

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One layer's KV tensor on this rank: the backend's shape for this rank's key/value
        heads, or for a latent attention model for its latent."""
        spec = self.mla_spec
        if spec is not None:
            return self.attn_backend.mla_kv_cache_shape(num_blocks, block_size,
                                                        spec.latent_dim)
        return self.attn_backend.kv_cache_shape(num_blocks, block_size, self.num_kv_heads,
                                                self.head_dim)

    def layer_kv_specs(self) -> list[int | str | None]:
        """Per model-wide layer: its attention window (None: full attention), or
        ``SSM_LAYER`` for a layer that keeps a state per request instead of a KV cache -
        what the worker reports to the engine (``get_kv_cache_spec``)."""
        return list(self.config.sliding_windows)

    def ssm_state_shape(self, num_slots: int) -> tuple[int, ...]:
        """One SSM layer's state tensor (fp32) on this rank, for ``num_slots`` requests
        (models with SSM layers only)."""
        raise NotImplementedError(f"{type(self).__name__} has no SSM layers")

    @property
    def uses_rope_lengths(self) -> bool:
        """Whether the model reads ``AttentionMetadata.rope_lengths`` (a length-dependent
        RoPE scaling), which the model runner then fills each step."""
        ropes = (self.config.rope, self.config.local_rope)
        return any(rope is not None and rope.length_dependent for rope in ropes)

    def forward(
        self,
        input_ids: torch.Tensor,  # int64 [T]
        positions: torch.Tensor,  # int64 [T]
        kv_caches: list[torch.Tensor],  # one per layer, attn_backend.kv_cache_shape(...)
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor | IntermediateTensors:
        """The hidden states ``[T, hidden_size]``. Pipeline-parallel models also take
        ``intermediate_tensors`` (a stage after the first) and return
        ``IntermediateTensors`` from a stage before the last; a model with
        ``get_input_embeddings`` also takes ``inputs_embeds``."""
        raise NotImplementedError

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings ``[T, hidden_size]`` of ``input_ids`` (vLLM's name), on the
        first pipeline stage. A model that has it also takes them back as ``forward``'s
        ``inputs_embeds`` keyword, which prompt embeddings need."""
        raise NotImplementedError(f"{type(self).__name__} does not take prompt embeddings "
                                  "(it has no get_input_embeddings)")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[N, vocab_size]`` for hidden states ``[N, hidden_size]`` (on the
        last pipeline stage: the others hold no LM head)."""
        assert isinstance(self.lm_head, ParallelLMHead), "logits on a stage without the LM head"
        return self.lm_head.compute_logits(hidden)

    # -- weights ---------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> set[str]:
        """Copy HF-named tensors into the parameters; returns the HF names loaded.

        Raises :class:`WeightLoadError` for a tensor the model has no place for or whose
        shape is wrong.
        """
        params = dict(self.named_parameters())
        missing_modules = tuple(f"{name}." for name, module in self.named_modules()
                                if isinstance(module, PPMissingLayer))
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            if self.ignores_weight(hf_name):
                continue
            param_name, shard_id = self.param_for(hf_name)
            param = params.get(param_name)
            if param is None and param_name.startswith(missing_modules):
                continue  # another pipeline stage's
            if param is None:
                raise WeightLoadError(hf_name, f"unexpected: {type(self).__name__} has no "
                                               f"parameter for it")
            weight_loader: Callable[..., None] = getattr(param, "weight_loader",
                                                         default_weight_loader)
            if isinstance(tensor, GgufTensor) and not getattr(param, "takes_gguf", False):
                tensor = tensor.dequantize()  # a dense parameter (--quantization none)
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
