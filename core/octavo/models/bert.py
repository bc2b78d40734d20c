"""``BertModel``: the BERT encoder (all-MiniLM-L6-v2 and the other sentence-transformers
BERTs), for the pooling runner.

Post-norm layers: self-attention over the whole prompt (bidirectional), its output
projection, a residual add and LayerNorm, then a GELU MLP with the same add and norm. The
input is the word embedding plus an absolute position embedding and the token-type
embedding of type 0 (one sentence per prompt), normalised. Parameter names are HF's, but
for q/k/v, fused (``stacked_params``); the checkpoint's pooler head (``pooler.dense``, a
tanh layer on [CLS] that sentence-transformers does not use) is skipped.

No KV cache: the scheduler never splits an encoder's prompt over steps, so a step holds
every token of each of its requests, and attention needs only that step's keys and
values. It runs dense: the step's flat tokens are scattered into a padded
``[requests, longest, ...]`` batch for one ``scaled_dot_product_attention`` per layer,
with a mask over the padding, and gathered back; the linear layers run on the unpadded
tokens. One padded call per layer was the fastest of the ways measured (a call per prompt,
length buckets; docs/serving.md has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from octavo.attention.base import AttentionBackend, AttentionMetadata
from octavo.models.base import CausalLM, default_dtype
from octavo.models.config import ArchConfig
from octavo.models.layers.embedding import VocabParallelEmbedding
from octavo.models.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

# Checkpoint tensors BERT folders hold that the encoder does not use.
UNUSED_WEIGHT_PREFIXES = ("pooler.", "embeddings.position_ids")


@dataclass
class PaddedLayout:
    """Where a step's flat tokens go in the padded attention batch."""

    num_reqs: int
    longest: int
    # int64 [T]: token t's row in the padded [num_reqs * longest]; None when every prompt
    # is as long as the longest, so the flat tokens are the padded batch already.
    slots: torch.Tensor | None
    mask: torch.Tensor | None  # bool [num_reqs, 1, 1, longest]: real keys; None: no padding

    @classmethod
    def of(cls, metadata: AttentionMetadata, device: torch.device) -> PaddedLayout:
        starts = metadata.query_start_loc_cpu
        assert starts is not None  # prepare_step always fills the host copy
        bounds = starts.numpy().astype(np.int64)
        counts = np.diff(bounds)
        longest = int(counts.max())
        if (counts == longest).all():
            return cls(len(counts), longest, None, None)
        owner = np.repeat(np.arange(len(counts)), counts)
        slots = owner * longest + (np.arange(bounds[-1]) - bounds[owner])
        keys = np.arange(longest)[None, :] < counts[:, None]
        return cls(len(counts), longest, torch.from_numpy(slots).to(device),
                   torch.from_numpy(keys[:, None, None, :]).to(device))

    def pad(self, flat: torch.Tensor) -> torch.Tensor:
        """``[T, width]`` -> ``[num_reqs * longest, width]``, zeros in the padding."""
        if self.slots is None:
            return flat
        padded = flat.new_zeros(self.num_reqs * self.longest, flat.shape[1])
        padded[self.slots] = flat
        return padded

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded if self.slots is None else padded[self.slots]


class BertEmbeddings(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = VocabParallelEmbedding(config.max_position_embeddings,
                                                          config.hidden_size)
        self.token_type_embeddings = VocabParallelEmbedding(config.type_vocab_size,
                                                            config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
                  + self.token_type_embeddings(torch.zeros_like(input_ids)))
        return self.LayerNorm(hidden)


class BertSelfAttention(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(config.hidden_size, config.head_dim,
                                          config.num_attention_heads,
                                          config.num_key_value_heads, bias=True)
        self.num_heads = self.qkv_proj.num_heads
        self.head_dim = config.head_dim

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        padded = layout.pad(self.qkv_proj(hidden))
        q, k, v = padded.view(layout.num_reqs, layout.longest, 3, self.num_heads,
                              self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.mask)
        width = self.num_heads * self.head_dim
        return layout.unpad(out.transpose(1, 2).reshape(-1, width))


class BertOutput(nn.Module):
    """A projection back to the hidden size (the attention's, or the MLP's down
    projection), then LayerNorm of it plus the block's input."""

    def __init__(self, config: ArchConfig, input_size: int) -> None:
        super().__init__()
        self.dense = RowParallelLinear(input_size, config.hidden_size, bias=True)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertOutput(config, config.hidden_size)

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        return self.output(self.self(hidden, layout), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(config.hidden_size, config.intermediate_size,
                                          bias=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden))  # HF's "gelu": the exact (erf) GELU


class BertLayer(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        attended = self.attention(hidden, layout)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(CausalLM):
    encoder_only = True
    activations = ("gelu",)
    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = (
        (".qkv_proj.", ".query.", "q"),
        (".qkv_proj.", ".key.", "k"),
        (".qkv_proj.", ".value.", "v"),
    )

    def __init__(self, config: ArchConfig, attn_backend: type[AttentionBackend],
                 dtype: torch.dtype) -> None:
        super().__init__(config, attn_backend, dtype)
        if config.max_position_embeddings < 1 or config.type_vocab_size < 1:
            raise ValueError("a BERT config needs max_position_embeddings and type_vocab_size")
        with default_dtype(dtype):
            self.embeddings = BertEmbeddings(config)
            self.encoder = BertEncoder(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """The last layer's hidden states ``[T, hidden]`` of a step whose requests are
        whole prompts (``kv_caches`` is empty: an encoder keeps none)."""
        del kv_caches
        layout = PaddedLayout.of(attn_metadata, input_ids.device)
        hidden = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            hidden = layer(hidden, layout)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("BertModel is an encoder: it has no LM head to sample from")

    def ignores_weight(self, hf_name: str) -> bool:
        return hf_name.startswith(UNUSED_WEIGHT_PREFIXES) or super().ignores_weight(hf_name)
