"""Medusa heads (Medusa-1, FasterDecoding/Medusa) and their proposer.

Head ``i`` reads the target's last hidden state at position ``t`` (after the final norm)
and guesses the token at ``t + 2 + i``: the target's own LM head already gives ``t + 1``.
Each head is ``num_layers`` residual blocks ``x + SiLU(W x + b)`` then a projection to the
vocabulary, exactly the published ``nn.Sequential`` so checkpoints load by name::

    {i}.{j}.linear.weight / .bias   ResBlock j of head i       [hidden, hidden] / [hidden]
    {i}.{num_layers}.weight         vocabulary projection      [vocab, hidden]

in ``medusa_lm_head.safetensors`` (or ``.pt``) next to a ``config.json`` with
``medusa_num_heads`` and ``medusa_num_layers``. Heads trained by ``octavo spec train`` keep
their projection equal to the target's LM head (Medusa-1 initialises it so); when every
projection equals it, the proposer drops the copies and runs all heads through the target's
LM head in one matmul, so k heads cost one extra LM-head read, not k. Those heads also store
their draft vocabulary as EAGLE-3's ``d2t`` tensor, and the shared projection then covers
only its rows (``projection.py``).

With ``speculative_token_tree`` the proposer drafts Medusa's candidate trees: node
``(r_1, ..., r_d)`` is head ``d``'s ``r_d``-th best token (a head sees only the hidden state,
so its candidates are the same under every parent). A head's top-1 is often wrong where
its second or third guess is right, and the tree verifies those too in the same pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from octavo.plugin_api import DraftTree, ProposeInputs, Proposer, ProposerContext
from octavo_spec_decode.heads_io import (
    HeadCheckpointError,
    check_layout,
    config_int,
    d2t_of,
    draft_ids_from_d2t,
    find_weights,
    read_config,
    read_tensors,
    write_head,
)
from octavo_spec_decode.projection import DraftProjection, lm_head_weight

WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int

    def to_json(self) -> dict[str, int]:
        return {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}


class ResBlock(nn.Module):
    """``x + SiLU(linear(x))``; a zero weight makes it the identity, Medusa's initial state."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHead(nn.Sequential):
    """``Sequential(ResBlock * num_layers, Linear(hidden, vocab))``: the published module,
    so its parameters keep the published names."""

    @classmethod
    def of(cls, config: MedusaConfig) -> MedusaHead:
        return cls(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)],
                   nn.Linear(config.hidden_size, config.vocab_size, bias=False))

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The input of the vocabulary projection: the ResBlocks' output."""
        return self[:-1](hidden)

    @property
    def projection(self) -> nn.Linear:
        """The vocabulary projection, the last module."""
        linear = self[-1]
        assert isinstance(linear, nn.Linear)
        return linear


class MedusaHeads(nn.ModuleList):
    """``num_heads`` x ``MedusaHead``."""

    def __init__(self, config: MedusaConfig) -> None:
        super().__init__(MedusaHead.of(config) for _ in range(config.num_heads))
        self.config = config
        self.draft_token_ids: torch.Tensor | None = None  # the draft vocabulary, if any

    def __iter__(self) -> Iterator[MedusaHead]:
        """The heads (``ModuleList`` types them as any module)."""
        for head in super().__iter__():
            assert isinstance(head, MedusaHead)
            yield head

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each head's input to its vocabulary projection: ``[num_heads, N, hidden]``."""
        return torch.stack([head.features(hidden) for head in self])

    def projections(self) -> list[torch.Tensor]:
        return [head.projection.weight for head in self]

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.state_dict().items()}


def load_medusa(folder: str | Path, hidden_size: int, vocab_size: int) -> MedusaHeads:
    """Heads from a published-layout folder, checked against the target's sizes."""
    folder = Path(folder)
    config = read_config(folder)
    medusa_config = MedusaConfig(
        num_heads=config_int(config, "medusa_num_heads", folder),
        num_layers=config_int(config, "medusa_num_layers", folder, default=1),
        hidden_size=hidden_size,
        vocab_size=vocab_size,
    )
    heads = MedusaHeads(medusa_config)
    path = find_weights(folder, WEIGHT_FILES)
    tensors = read_tensors(path)
    d2t = tensors.pop("d2t", None)
    check_layout(path, tensors, heads.expected_shapes())
    heads.load_state_dict(tensors)
    if d2t is not None:
        heads.draft_token_ids = draft_ids_from_d2t(path, d2t, vocab_size)
    return heads


def save_medusa(heads: MedusaHeads, folder: str | Path, base_model: str = "",
                weights_name: str = WEIGHT_FILES[0]) -> None:
    config = {**heads.config.to_json(), "base_model_name_or_path": base_model}
    tensors = dict(heads.state_dict())
    if heads.draft_token_ids is not None:
        tensors["d2t"] = d2t_of(heads.draft_token_ids)
    write_head(Path(folder), weights_name, tensors, config)


class MedusaProposer(Proposer):
    """Drafts ``k`` tokens per request from the last accepted position's hidden state:
    draft ``i`` is head ``i``'s argmax (Medusa's top-1 chain, a one-hot proposal), or with
    a tree, each node's candidate."""

    name = "medusa"
    requires_model = True
    needs_hidden_states = True
    supports_token_tree = True

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        assert context.config.model is not None  # SpeculativeConfig requires it
        lm_head = lm_head_weight(context.target)
        heads = load_medusa(context.config.model, hidden_size=lm_head.shape[1],
                            vocab_size=context.vocab_size)
        if heads.config.num_heads < self.num_speculative_tokens:
            raise HeadCheckpointError(
                f"{context.config.model}: has {heads.config.num_heads} Medusa heads, fewer "
                f"than num_speculative_tokens={self.num_speculative_tokens}")
        self.shares_lm_head = all(torch.equal(w.to(lm_head.dtype), lm_head)
                                  for w in heads.projections())
        if self.shares_lm_head:  # keep only the ResBlocks; the target's LM head projects
            for head in heads:
                head.projection.weight = nn.Parameter(lm_head, requires_grad=False)
        self.heads = heads.to(device=context.device, dtype=context.dtype).eval()
        self.projection = DraftProjection(context.target, heads.draft_token_ids,
                                          context.dtype, context.device, context.platform) \
            if self.shares_lm_head else None
        self.tree = DraftTree.of(context.config)

    @torch.inference_mode()
    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        assert inputs.hidden_states is not None  # needs_hidden_states
        wanted = torch.from_numpy(inputs.wants_drafts).to(inputs.last_token_indices.device)
        rows = inputs.last_token_indices[wanted]
        drafts: list[list[int]] = [[] for _ in inputs.req_ids]
        if not len(rows):
            return drafts
        room = self.context.max_model_len - inputs.num_tokens - 1
        hidden = inputs.hidden_states[rows]
        tokens = (self.draft(hidden, self.num_speculative_tokens) if self.tree is None
                  else self.draft_tree(hidden)).tolist()
        for i, row_tokens in zip(inputs.wants_drafts.nonzero()[0].tolist(), tokens):
            drafts[i] = row_tokens[:max(0, int(room[i]))]
        return drafts

    def draft(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Top-1 tokens ``[N, k]`` of the first ``k`` heads for hidden states ``[N, h]``."""
        return self.column_tokens(self.head_logits(hidden, k).argmax(-1).T)

    def draft_tree(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tree's node tokens ``[N, nodes]``: head ``d``'s candidate of rank ``r_d``."""
        assert self.tree is not None
        wanted = self.tree.ranks_per_depth()
        logits = self.head_logits(hidden, len(wanted))
        candidates = logits.topk(max(wanted), dim=-1).indices  # [depth, N, R]
        depths = torch.from_numpy(self.tree.depths - 1).to(candidates.device)
        ranks = torch.tensor([path[-1] for path in self.tree.paths], device=candidates.device)
        return self.column_tokens(candidates[depths, :, ranks].T)

    def head_logits(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """Logits ``[k, N, columns]`` of the first ``k`` heads for hidden states ``[N, h]``:
        over the draft vocabulary when the heads share the target's LM head and have one
        (``column_tokens`` maps a column to its token), else over the whole vocabulary."""
        features = self.heads.features(hidden)[:k]
        if self.projection is not None:
            return self.projection.logits(features.flatten(0, 1)).view(k, len(hidden), -1)
        return torch.stack([head.projection(f) for head, f in zip(self.heads, features)])

    def column_tokens(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.projection is None else self.projection.tokens(columns)
