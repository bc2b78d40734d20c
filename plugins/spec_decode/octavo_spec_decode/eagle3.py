"""EAGLE-3 head (SafeAILab/EAGLE's EAGLE-3, vLLM's ``llama_eagle3.py``) and its proposer.

Where EAGLE-1 reads the target's last feature, EAGLE-3 reads three: the hidden states
entering three of the target's layers (``aux``: by default layers 2, L // 2 and L - 3 of L,
vLLM's choice; a checkpoint may name its own in ``eagle_aux_hidden_state_layer_ids``),
concatenated in layer order. At position ``p`` the first step fuses them, ``fc(aux_p)``, and
with the embedding of the next token ``x_{p+1}`` the one decoder layer (``midlayer``) gives a
hidden state whose norm, through the head's *own* LM head over its draft vocabulary, guesses
``x_{p+2}``. Later steps chain that hidden state (before the norm) as it is - it is not
fused again - with the embedding of the draft just made. The midlayer attends over
``concat(input_layernorm(embed), hidden_norm(hidden))``, so q/k/v take 2h; its residual is
the incoming hidden state (``norm_before_residual`` in the config: its norm). The token
embedding is the target's.

Published layout (``model.safetensors`` or ``pytorch_model.bin`` + ``config.json``, a
LlamaConfig with ``draft_vocab_size``)::

    fc.weight [h, 3h]
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight [h]
    midlayer.self_attn.{q,k,v}_proj.weight [*, 2h], midlayer.self_attn.o_proj.weight
    midlayer.mlp.{gate,up,down}_proj.weight
    norm.weight [h], lm_head.weight [draft_vocab_size, h]
    d2t [draft_vocab_size]      draft token i is target token i + d2t[i]
    t2d [vocab_size] (bool)     optional: which target tokens are in the draft vocabulary
    embed_tokens.weight         optional, ignored (the target's is used)

KV cache: like EAGLE-1's, the midlayer's paged cache uses the *target's* block ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from octavo.plugin_api import (
    ArchConfig,
    AttentionBackend,
    AttentionMetadata,
    ConfigError,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    ProposeInputs,
    ProposerContext,
    RMSNorm,
)
from octavo_spec_decode.eagle import (
    WEIGHT_FILES,
    DraftHead,
    EagleProposer,
    eagle_arch_config,
    param_for,
    published_names,
    split_sizes,
)
from octavo_spec_decode.heads_io import (
    HeadCheckpointError,
    check_layout,
    d2t_of,
    draft_ids_from_d2t,
    find_weights,
    read_config,
    read_tensors,
    write_head,
)
from octavo_spec_decode.projection import DraftProjection

AUX_LAYERS_KEY = "eagle_aux_hidden_state_layer_ids"  # vLLM's config key
NUM_AUX_LAYERS = 3
# Tensors some published checkpoints carry that the head does not use.
UNUSED = ("embed_tokens.weight", "rotary_emb.inv_freq")
ARCHITECTURE = "LlamaForCausalLMEagle3"  # what SafeAILab's EAGLE-3 configs say


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default: an early, a middle and a late layer."""
    return (2, num_layers // 2, num_layers - 3)


def checked_aux_layers(layers: object, num_layers: int, source: str) -> tuple[int, ...]:
    """Three distinct layer indices of a target with ``num_layers`` layers, ascending (the
    order the states are concatenated in, as vLLM does)."""
    ids = list(layers) if isinstance(layers, (list, tuple)) else []
    ok = (len(ids) == NUM_AUX_LAYERS
          and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
                  for i in ids) and len(set(ids)) == NUM_AUX_LAYERS)
    if not ok:
        raise HeadCheckpointError(
            f"{source}: {AUX_LAYERS_KEY} {layers!r}: EAGLE-3 needs {NUM_AUX_LAYERS} distinct "
            f"layer indices of the target, each in 0..{num_layers - 1}")
    return tuple(sorted(ids))


def aux_layers_of(hf_config: dict, num_layers: int, source: str) -> tuple[int, ...]:
    """The target layers a head reads: its config's, or vLLM's default."""
    layers = hf_config.get(AUX_LAYERS_KEY) or list(default_aux_layers(num_layers))
    return checked_aux_layers(layers, num_layers, source)


class Eagle3Layer(nn.Module):
    """The midlayer: a Llama decoder layer over ``[norm(embed), norm(hidden)]`` (2h wide)."""

    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 norm_before_residual: bool) -> None:
        super().__init__()
        # A decoder layer's parts, its attention projecting q/k/v from the 2h input.
        layer = LlamaDecoderLayer.build(config, attn_backend, input_size=2 * config.hidden_size)
        self.input_layernorm = layer.input_layernorm
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = layer.self_attn
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.mlp = layer.mlp
        self.norm_before_residual = norm_before_residual

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """The layer's output hidden state (residual added, before the head's norm)."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat((self.input_layernorm(embeds), normed), dim=-1)
        x = self.self_attn(positions, x, kv_cache, metadata)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x) + residual


@dataclass(frozen=True)
class Eagle3Shape:
    """What a head's parameters are sized by, besides the target's layer shape."""

    draft_vocab_size: int
    norm_before_residual: bool = False


class Eagle3Head(DraftHead):
    """``fc`` + ``midlayer`` + ``norm`` + ``lm_head``; ``embed`` is the target's (shared)."""

    draft_token_ids: torch.Tensor  # never None: the head's LM head covers these tokens only

    def __init__(self, config: ArchConfig, shape: Eagle3Shape,
                 attn_backend: type[AttentionBackend], embed: nn.Module) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.shape = shape
        self.fc = nn.Linear(NUM_AUX_LAYERS * hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config, attn_backend, shape.norm_before_residual)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, shape.draft_vocab_size, bias=False)
        self.embed = [embed]  # a list keeps the target's module out of state_dict()
        # Target ids of the draft vocabulary (``d2t``), row i of lm_head for token ids[i].
        self.draft_token_ids = torch.arange(shape.draft_vocab_size)

    def num_kv_layers(self) -> int:
        return 1  # the midlayer

    def combine(self, aux: list[torch.Tensor]) -> torch.Tensor:
        """The first step's hidden state from the target's aux states ``3 x [T, h]``."""
        return self.fc(torch.cat(aux, dim=-1))

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> torch.Tensor:
        """The next hidden states ``[T, h]`` (before ``norm``) for hidden states ``[T, h]``
        (``combine``'s, or the head's own) and next tokens ``[T]``."""
        embeds = self.embed[0](input_ids).to(hidden.dtype)
        return self.midlayer(positions, embeds, hidden, kv_caches[0], metadata)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary for ``forward``'s hidden states."""
        return self.lm_head(self.norm(hidden))

    # -- published names ---------------------------------------------------------------
    def published_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the published layout (fused q/k/v and gate/up split)."""
        tensors: dict[str, torch.Tensor] = {}
        for name, param in self.state_dict().items():
            parts = published_names(name)
            for part, tensor in zip(parts, param.split(split_sizes(self, name, len(parts)))):
                tensors[part] = tensor
        tensors["d2t"] = d2t_of(self.draft_token_ids)
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        t2d[self.draft_token_ids] = True
        tensors["t2d"] = t2d
        return tensors

    def load_published(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        """Fill the head from a checkpoint's tensors, after checking every name and shape
        against the head's own layout."""
        tensors = {name: t for name, t in tensors.items() if not name.endswith(UNUSED)}
        expected = {name: tuple(t.shape) for name, t in self.published_tensors().items()}
        check_layout(path, tensors, expected, optional={"t2d"})
        vocab_size = expected["t2d"][0]
        self.draft_token_ids = draft_ids_from_d2t(path, tensors.pop("d2t"), vocab_size)
        t2d = tensors.pop("t2d", None)
        if t2d is not None and not (t2d.dtype == torch.bool
                                    and int(t2d.sum()) == len(self.draft_token_ids)
                                    and bool(t2d[self.draft_token_ids].all())):
            raise HeadCheckpointError(f"{path}: tensor 't2d' does not mark the draft "
                                      f"vocabulary that 'd2t' maps to")
        params = dict(self.named_parameters())
        for name, tensor in tensors.items():
            param_name, shard_id = param_for(name)
            param = params[param_name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor, shard_id)


def load_eagle3(folder: str | Path, attn_backend: type[AttentionBackend], embed: nn.Module,
                target_config: ArchConfig) -> tuple[Eagle3Head, tuple[int, ...]]:
    """An EAGLE-3 head from a published-layout folder, checked against the target, and the
    target layers whose aux states it reads."""
    folder = Path(folder)
    hf_config = read_config(folder)
    path = find_weights(folder, WEIGHT_FILES)
    tensors = read_tensors(path)
    source = str(folder / "config.json")
    if not any(name.startswith("midlayer.") for name in tensors):
        raise HeadCheckpointError(f"{path}: no 'midlayer.*' tensors: not an EAGLE-3 head "
                                  f"(an EAGLE-1 head loads with method 'eagle')")
    config = eagle_arch_config(hf_config, folder)
    target_hidden = hf_config.get("target_hidden_size") or config.hidden_size
    if config.hidden_size != target_config.hidden_size or \
            target_hidden != target_config.hidden_size:
        raise HeadCheckpointError(f"{source}: hidden_size {config.hidden_size} (target_hidden_"
                                  f"size {target_hidden}) does not match the target's "
                                  f"{target_config.hidden_size}")
    if config.vocab_size != target_config.vocab_size:
        raise HeadCheckpointError(f"{source}: vocab_size {config.vocab_size} does not match "
                                  f"the target's {target_config.vocab_size}")
    draft_vocab_size = hf_config.get("draft_vocab_size") or config.vocab_size
    if not isinstance(draft_vocab_size, int) or not 0 < draft_vocab_size <= config.vocab_size:
        raise HeadCheckpointError(f"{source}: draft_vocab_size {draft_vocab_size!r} must be "
                                  f"an integer in 1..vocab_size ({config.vocab_size})")
    aux_layers = aux_layers_of(hf_config, target_config.num_hidden_layers, source)
    shape = Eagle3Shape(draft_vocab_size, bool(hf_config.get("norm_before_residual", False)))
    head = Eagle3Head(config, shape, attn_backend, embed)
    head.load_published(path, tensors)
    return head, aux_layers


def save_eagle3(head: Eagle3Head, folder: str | Path, hf_config: dict,
                aux_layers: tuple[int, ...], weights_name: str = WEIGHT_FILES[0]) -> None:
    """Write the head with the target's ``hf_config`` (one layer, the head's draft vocabulary
    and the aux layers it was trained on)."""
    config = {**hf_config, "num_hidden_layers": 1, "architectures": [ARCHITECTURE],
              "draft_vocab_size": head.shape.draft_vocab_size,
              "norm_before_residual": head.shape.norm_before_residual,
              AUX_LAYERS_KEY: list(aux_layers)}
    write_head(Path(folder), weights_name, head.published_tensors(), config)


class Eagle3Proposer(EagleProposer):
    """EAGLE-1's drafting loop (``EagleProposer``) on an EAGLE-3 head: the first step reads
    ``fc`` of the target's aux states, a hidden state becomes a token through the head's
    norm and own LM head."""

    name = "eagle3"
    requires_model = True
    needs_hidden_states = False
    head: Eagle3Head

    def __init__(self, context: ProposerContext) -> None:
        super(EagleProposer, self).__init__(context)  # Proposer's: the head differs
        assert context.config.model is not None  # SpeculativeConfig requires it
        target = context.target
        if target.ranks.pp_size > 1:
            raise ConfigError("speculative_config: method 'eagle3' reads hidden states of "
                              "three target layers, which pipeline parallelism spreads over "
                              "stages; use it with pipeline_parallel_size 1")
        if not isinstance(target, LlamaForCausalLM):
            raise ConfigError(f"speculative_config: method 'eagle3' needs a Llama-family "
                              f"target, not {type(target).__name__}")
        self.head, self.aux_hidden_state_layers = load_eagle3(
            context.config.model, context.attn_backend, target.model.embed_tokens,
            target.config)
        self.head.to(device=context.device, dtype=context.dtype).eval()
        context.platform.prepare_model(self.head, context.dtype)
        self.kv_caches: list[torch.Tensor] = []
        self.projection = DraftProjection(target, self.head.draft_token_ids, context.dtype,
                                          context.device, context.platform,
                                          weight=self.head.lm_head.weight)

    def _features(self, inputs: ProposeInputs, index: torch.Tensor) -> torch.Tensor:
        assert inputs.aux_hidden_states is not None  # aux_hidden_state_layers
        return self.head.combine([states[index] for states in inputs.aux_hidden_states])

    def _top_tokens(self, predicted: torch.Tensor) -> np.ndarray:
        best = self.projection.logits(self.head.norm(predicted)).argmax(-1)
        return self.projection.tokens(best).cpu().numpy()
