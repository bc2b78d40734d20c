"""EAGLE-1 head (SafeAILab/EAGLE) and its proposer.

The head is one Llama decoder layer over ``fc(concat(embed(token), feature))``: at
position ``p`` it reads the target's feature ``f_p`` (the last hidden state, after the final
norm) and the embedding of the *next* token ``x_{p+1}``, and predicts the feature
``f_{p+1}``; the target's LM head turns that into a guess for ``x_{p+2}``. Chaining its own
predicted features, it drafts k tokens. The embedding and LM head are the target's.

Published layout (``pytorch_model.bin`` or ``model.safetensors`` + ``config.json``, a
LlamaConfig with ``num_hidden_layers`` = 1 and optionally ``bias`` for ``fc``)::

    fc.weight [h, 2h], fc.bias [h]
    layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.mlp.{gate,up,down}_proj.weight,
    layers.0.post_attention_layernorm.weight     (layer 0 has no input_layernorm)
    embed_tokens.weight                           (optional; the target's is used)
    d2t [draft_vocab_size]                        (optional, EAGLE-3's draft vocabulary:
                                                   draft token i is target token i + d2t[i])

With ``d2t``, drafts are the argmax over the draft vocabulary only: on a small target with a
large vocabulary (SmolLM2: 49k rows x 576) the k LM-head products of a chain would
otherwise cost more than half a target forward. ``octavo spec train`` writes the tokens of
its training text there.

EAGLE-3 checkpoints (``midlayer.*``, ``fc`` [h, 3h], own ``lm_head`` with ``d2t``/``t2d``)
are recognised and sent to ``method: eagle3`` (``eagle3.py``) with a clear error.

KV cache: the head's layer keeps a paged cache of its own, laid out with the *target's*
block ids (like the draft-model proposer), so the scheduler's block tables and lookahead
slots serve it and a rejected draft's entry is simply overwritten the next step; no
per-request bookkeeping is needed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from octavo.plugin_api import (
    ArchConfig,
    AttentionBackend,
    AttentionMetadata,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    ModelLoadError,
    ProposeInputs,
    Proposer,
    ProposerContext,
    StepInputs,
    WeightShapeError,
)
from octavo_spec_decode.heads_io import (
    HeadCheckpointError,
    d2t_of,
    draft_ids_from_d2t,
    find_weights,
    read_config,
    read_tensors,
    write_head,
)
from octavo_spec_decode.projection import DraftProjection

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pt")
# Tensors some published checkpoints carry that the head does not use.
UNUSED = ("embed_tokens.weight", "rotary_emb.inv_freq")


class DraftHead(nn.Module):
    """What ``EagleProposer``'s drafting loop and ``split_sizes`` use of a head: EAGLE-1's
    (``EagleHead``) and EAGLE-3's (``Eagle3Head``). Its forward takes hidden states ``[T,
    h]``, the next tokens ``[T]``, their positions, a KV cache per ``num_kv_layers()`` and
    the attention metadata, and predicts the next hidden states ``[T, h]``."""

    config: ArchConfig  # the head's layer shape
    # Target ids of the draft vocabulary (None: the whole vocabulary).
    draft_token_ids: torch.Tensor | None

    def num_kv_layers(self) -> int:
        """Decoder layers with a KV cache (one each)."""
        raise NotImplementedError


class EagleHead(DraftHead):
    """``fc`` + decoder layers; ``embed`` is the target's token embedding (shared, frozen)."""

    def __init__(self, config: ArchConfig, fc_bias: bool, attn_backend: type[AttentionBackend],
                 embed: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.fc_bias = fc_bias
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList(self._layer(config, attn_backend, index)
                                    for index in range(config.num_hidden_layers))
        self.embed = [embed]  # a list keeps the target's module out of state_dict()
        self.draft_token_ids = None

    def num_kv_layers(self) -> int:
        return len(self.layers)

    @staticmethod
    def _layer(config: ArchConfig, attn_backend: type[AttentionBackend],
               index: int) -> LlamaDecoderLayer:
        layer = LlamaDecoderLayer.build(config, attn_backend)
        if index == 0:  # its input is fc's output, not a residual stream: EAGLE skips the norm
            layer.input_layernorm = nn.Identity()
        return layer

    def forward(self, features: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> torch.Tensor:
        """Predicted next features ``[T, h]`` for features ``[T, h]`` and next tokens ``[T]``."""
        embeds = self.embed[0](input_ids).to(features.dtype)
        hidden = self.fc(torch.cat((embeds, features), dim=-1))
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, metadata)
        return hidden + residual

    # -- published names ---------------------------------------------------------------
    def published_tensors(self) -> dict[str, torch.Tensor]:
        """The state dict under the published names (fused q/k/v and gate/up split)."""
        tensors: dict[str, torch.Tensor] = {}
        if self.draft_token_ids is not None:
            tensors["d2t"] = d2t_of(self.draft_token_ids)
        for name, param in self.state_dict().items():
            parts = published_names(name)
            sizes = split_sizes(self, name, len(parts))
            for part, tensor in zip(parts, param.split(sizes)):
                tensors[part] = tensor
        return tensors

    def load_published(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in tensors.items():
            if name.endswith(UNUSED):
                continue
            if name == "d2t":
                self.draft_token_ids = draft_ids_from_d2t(path, tensor, self.config.vocab_size)
                continue
            param_name, shard_id = param_for(name)
            param = params.get(param_name)
            if param is None:
                raise HeadCheckpointError(f"{path}: unexpected tensor {name!r} for an EAGLE-1 "
                                          f"head (expected fc.*, layers.N.*)")
            loader = getattr(param, "weight_loader", None)
            try:
                if loader is None:
                    if param.shape != tensor.shape:
                        raise WeightShapeError(f"shape {tuple(tensor.shape)} does not match "
                                               f"{tuple(param.shape)}")
                    param.data.copy_(tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as exc:
                raise HeadCheckpointError(f"{path}: tensor {name!r}: {exc}") from None
            loaded.add(name)
        missing = [hf for name, _ in self.named_parameters()
                   for hf in published_names(name) if hf not in loaded]
        if missing:
            raise HeadCheckpointError(f"{path}: missing tensor {missing[0]!r}")


# The head's layer fuses q/k/v and gate/up as the target's layers do; checkpoints split them.
FUSED = LlamaForCausalLM.stacked_params


def param_for(published: str) -> tuple[str, object]:
    """The head parameter a published tensor fills, and its shard id (None: the whole)."""
    for fused, part, shard_id in FUSED:
        if part in published:
            return published.replace(part, fused), shard_id
    return published, None


def published_names(param_name: str) -> list[str]:
    """The published tensors that together make a head parameter, in shard order."""
    return [param_name.replace(fused, part)
            for fused, part, _ in FUSED if fused in param_name] or [param_name]


def split_sizes(head: DraftHead, name: str, num_parts: int) -> list[int]:
    """Row counts of the published tensors a fused head parameter splits into."""
    if num_parts == 1:
        return [head.get_parameter(name).shape[0]]
    config = head.config
    if ".qkv_proj." in name:
        kv = config.num_key_value_heads * config.head_dim
        return [config.num_attention_heads * config.head_dim, kv, kv]
    return [config.intermediate_size, config.intermediate_size]


def eagle_arch_config(hf_config: dict, folder: Path) -> ArchConfig:
    try:
        return ArchConfig.from_hf(hf_config, folder / "config.json")
    except ModelLoadError as exc:
        raise HeadCheckpointError(str(exc)) from None


def load_eagle(folder: str | Path, attn_backend: type[AttentionBackend], embed: nn.Module,
               hidden_size: int) -> EagleHead:
    """An EAGLE-1 head from a published-layout folder, sized for a target with
    ``hidden_size``."""
    folder = Path(folder)
    hf_config = read_config(folder)
    path = find_weights(folder, WEIGHT_FILES)
    tensors = read_tensors(path)
    if any(name.startswith("midlayer.") for name in tensors):
        raise HeadCheckpointError(f"{path}: tensor 'midlayer.*' marks an EAGLE-3 head: use "
                                  "method 'eagle3' (EAGLE-1 layout: layers.0.*)")
    config = eagle_arch_config(hf_config, folder)
    if config.hidden_size != hidden_size:
        raise HeadCheckpointError(f"{folder / 'config.json'}: hidden_size {config.hidden_size}"
                                  f" does not match the target's {hidden_size}")
    fc_bias = bool(hf_config.get("bias", "fc.bias" in tensors))
    head = EagleHead(config, fc_bias, attn_backend, embed)
    head.load_published(path, tensors)
    return head


def save_eagle(head: EagleHead, folder: str | Path, hf_config: dict,
               weights_name: str = WEIGHT_FILES[0]) -> None:
    """Write the head with the target's ``hf_config`` (layer count set to the head's)."""
    config = {**hf_config, "num_hidden_layers": head.config.num_hidden_layers,
              "bias": head.fc_bias, "architectures": ["LlamaForCausalLM"]}
    if head.draft_token_ids is not None:
        config["draft_vocab_size"] = len(head.draft_token_ids)
    write_head(Path(folder), weights_name, head.published_tensors(), config)


def head_config(target_config: ArchConfig, num_layers: int = 1) -> ArchConfig:
    """The architecture of a new head for a target: the target's layer shape."""
    return replace(target_config, num_hidden_layers=num_layers,
                   sliding_windows=(None,) * num_layers)


class EagleProposer(Proposer):
    """Each step: write the head's cache entries for the positions the target just
    verified (their real features), then chain k single-token steps on its own features."""

    name = "eagle"
    requires_model = True
    needs_hidden_states = True

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        assert context.config.model is not None  # SpeculativeConfig requires it
        target = context.target
        self.head: DraftHead = load_eagle(context.config.model, context.attn_backend,
                                          target.model.embed_tokens,
                                          hidden_size=target.config.hidden_size)
        self.head.to(device=context.device, dtype=context.dtype).eval()
        context.platform.prepare_model(self.head, context.dtype)
        self.kv_caches: list[torch.Tensor] = []
        self.projection = DraftProjection(target, self.head.draft_token_ids, context.dtype,
                                          context.device, context.platform)

    def _cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        config = self.head.config
        return self.context.attn_backend.kv_cache_shape(
            num_blocks, self.context.block_size, config.num_key_value_heads, config.head_dim)

    def kv_cache_bytes_per_block(self) -> int:
        per_layer = int(np.prod(self._cache_shape(1)))
        return per_layer * torch.finfo(self.context.dtype).bits // 8 * self.head.num_kv_layers()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = [torch.zeros(self._cache_shape(num_blocks), dtype=self.context.dtype,
                                      device=self.context.device)
                          for _ in range(self.head.num_kv_layers())]

    @torch.inference_mode()
    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        assert inputs.block_table is not None
        context, k = self.context, self.num_speculative_tokens
        tokens, positions, counts, feature_index = verified_entries(inputs)
        block_tables = inputs.block_table[inputs.rows]
        step = StepInputs.for_tokens(tokens, positions, counts, block_tables,
                                     context.block_size, context.device)
        features = self._features(inputs, torch.from_numpy(feature_index).to(context.device))
        predicted = self.head(features, step.input_ids, step.positions, self.kv_caches,
                              step.metadata)[step.logits_indices]
        room = np.minimum(k, context.max_model_len - inputs.num_tokens - 1)
        num_drafts = np.where(inputs.wants_drafts, np.maximum(room, 0), 0)
        drafts = np.zeros((len(counts), k), dtype=np.int64)
        last_positions = positions[np.cumsum(counts) - 1]
        active = np.arange(len(counts))
        for j in range(int(num_drafts.max(initial=0))):
            drafts[active, j] = self._top_tokens(predicted)
            keep = num_drafts[active] > j + 1
            active, predicted = active[keep], predicted[torch.from_numpy(keep).to(context.device)]
            if not len(active):
                break
            single = StepInputs.for_tokens(drafts[active, j], last_positions[active] + j + 1,
                                           np.ones(len(active), np.int64), block_tables[active],
                                           context.block_size, context.device)
            predicted = self.head(predicted, single.input_ids, single.positions,
                                  self.kv_caches, single.metadata)
        return [drafts[i, :n].tolist() for i, n in enumerate(num_drafts.tolist())]


    def _features(self, inputs: ProposeInputs, index: torch.Tensor) -> torch.Tensor:
        """The head's input for the step's tokens at ``index``: the target's features."""
        assert inputs.hidden_states is not None  # needs_hidden_states
        return inputs.hidden_states[index]

    def _top_tokens(self, predicted: torch.Tensor) -> np.ndarray:
        """The argmax token of each predicted feature, over the draft vocabulary if any."""
        best = self.projection.logits(predicted).argmax(-1)
        return self.projection.tokens(best).cpu().numpy()


def verified_entries(inputs: ProposeInputs,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The head's cache entries the step made known: per request, every position ``p`` the
    target computed whose input token turned out right (scheduled non-draft tokens and
    accepted drafts), paired with the next token ``x_{p+1}`` - a prompt token, an accepted
    draft or the token just sampled. Returns the next tokens, positions, per-request counts
    and each entry's index into the step's hidden states."""
    assert inputs.step.metadata.query_start_loc_cpu is not None
    bounds = inputs.step.metadata.query_start_loc_cpu.numpy().astype(np.int64)
    num_sampled = np.array([len(s) for s in inputs.sampled_token_ids], dtype=np.int64)
    counts = np.diff(bounds) - inputs.num_draft_tokens + np.maximum(num_sampled - 1, 0)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    first_positions = inputs.step.positions.cpu().numpy()[bounds[:-1]]
    positions = np.repeat(first_positions, counts) + offsets
    tokens = inputs.token_ids[np.repeat(inputs.rows, counts), positions + 1]
    return tokens, positions, counts, np.repeat(bounds[:-1], counts) + offsets
