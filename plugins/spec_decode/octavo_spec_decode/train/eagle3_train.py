"""Training an EAGLE-3 head: the target's aux states in, its next-token distribution out,
with EAGLE-3's training-time test.

Position ``p`` reads ``fc(aux_p)`` and the token ``x_{p+1}`` and learns the target's whole
distribution at ``p + 1`` (its guess for ``x_{p+2}``) over the draft vocabulary -
self-distillation, with no feature regression (EAGLE-3 dropped it). The training-time test
then unrolls the drafting chain as inference runs it: step ``j`` reads step ``j - 1``'s own
output hidden state and the token ``x_{p+1+j}`` at position ``p + j``, attends the real
context and its own chain (``ttt_attention.py``), and learns the target's distribution at
``p + 1 + j``. Step losses are weighted ``0.8 ** j`` as in EAGLE-3. The head's LM head starts
as the target's rows of the draft vocabulary and stays frozen (as EAGLE-1's training keeps
the target's): it keeps a step's cost to the draft-vocabulary products.
"""

from __future__ import annotations

import random

import torch

from octavo.plugin_api import AttentionBackend, CausalLM, PPMissingLayer
from octavo_spec_decode.eagle import head_config
from octavo_spec_decode.eagle3 import Eagle3Head, Eagle3Shape
from octavo_spec_decode.projection import lm_head_weight
from octavo_spec_decode.train.data import Sequence
from octavo_spec_decode.train.dense_attention import full_sequence_metadata
from octavo_spec_decode.train.eagle_train import init_like_llama
from octavo_spec_decode.train.optimize import STEP_WEIGHT, distillation, optimize
from octavo_spec_decode.train.targets import TokenSubset, label_tokens, reply_mask
from octavo_spec_decode.train.ttt_attention import TrainingTimeTestBackend, TrainingTimeTestImpl

# Drafting steps unrolled in training: the k of `spec train`'s default measurement.
TTT_STEPS = 3


def new_eagle3_head(target: CausalLM, draft_token_ids: torch.Tensor,
                    attn_backend: type[AttentionBackend] = TrainingTimeTestBackend,
                    ) -> Eagle3Head:
    """An untrained head shaped like one of the target's layers (HF's Llama init), its LM
    head and final norm copied from the target's."""
    head = Eagle3Head(head_config(target.config), Eagle3Shape(len(draft_token_ids)),
                      attn_backend, target.model.embed_tokens)
    init_like_llama(head)
    norm = target.model.norm
    assert not isinstance(norm, PPMissingLayer), "training targets are one stage"
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_head_weight(target)[draft_token_ids])
        head.norm.weight.copy_(norm.weight)
    head.lm_head.weight.requires_grad_(False)
    head.draft_token_ids = draft_token_ids
    return head


class Eagle3Batch:
    """Sequences flattened back to back; per unrolled step ``j``, each entry's input token
    and the row of ``features`` whose distribution it learns (where ``masks[j]``)."""

    def __init__(self, sequences: list[Sequence], num_steps: int) -> None:
        lengths, aux, positions, features = [], [], [], []
        tokens: list[list[torch.Tensor]] = [[] for _ in range(num_steps)]
        rows: list[list[torch.Tensor]] = [[] for _ in range(num_steps)]
        masks: list[list[torch.Tensor]] = [[] for _ in range(num_steps)]
        offset = 0
        for seq in sequences:
            assert seq.aux_features is not None and seq.features is not None
            n = len(seq.token_ids) - 1  # entries p = 0 .. L-2
            lengths.append(n)
            aux.append(seq.aux_features[:n].float())
            features.append(seq.features)
            positions.append(torch.arange(n))
            padded = torch.cat([seq.token_ids, seq.token_ids.new_zeros(num_steps)])
            for j in range(num_steps):
                tokens[j].append(padded[1 + j: 1 + j + n])
                rows[j].append(offset + torch.arange(n) + 1 + j)
                masks[j].append(reply_mask(seq, 2 + j)[:n])
            offset += len(seq.token_ids)
        self.aux, self.positions = torch.cat(aux), torch.cat(positions)
        self.tokens = [torch.cat(t) for t in tokens]
        self.masks = [torch.cat(m) for m in masks]
        self.rows = [torch.cat(r)[m] for r, m in zip(rows, self.masks)]
        self.features = torch.cat(features)
        self.metadata = full_sequence_metadata(lengths, self.aux.device)

    def unrolled(self, head: Eagle3Head) -> list[torch.Tensor]:
        """Each step's output hidden states (before the head's norm), every entry."""
        attention = head.midlayer.self_attn.attn
        assert isinstance(attention, TrainingTimeTestImpl)
        attention.reset()
        hidden, outputs = head.combine([self.aux]), []
        for j, tokens in enumerate(self.tokens):
            hidden = head(hidden, tokens, self.positions + j, [torch.empty(0)], self.metadata)
            outputs.append(hidden)
        attention.reset()
        return outputs

    def loss(self, head: Eagle3Head, subset_lm_head: torch.Tensor) -> torch.Tensor:
        """Step-weighted cross-entropy against the target's distributions."""
        loss = torch.zeros(())
        for j, hidden in enumerate(self.unrolled(head)):
            mask = self.masks[j]
            if not mask.any():
                continue
            loss = loss + STEP_WEIGHT ** j * distillation(
                head.logits(hidden[mask]), self.features[self.rows[j]], subset_lm_head)
        return loss


def train_eagle3(target: CausalLM, sequences: list[Sequence], steps: int, seed: int,
                 num_steps: int = TTT_STEPS, batch_sequences: int = 8, lr: float = 1e-3,
                 ) -> Eagle3Head:
    """A head trained for ``steps`` optimizer steps of ``batch_sequences`` whole sequences,
    its draft vocabulary the tokens of the training text."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    subset = TokenSubset.of(sequences, lm_head_weight(target).shape[0])
    head = new_eagle3_head(target, subset.token_ids)
    subset_lm_head = head.lm_head.weight  # the target's rows, frozen

    def step_loss() -> torch.Tensor:
        batch = Eagle3Batch(rng.sample(sequences, min(batch_sequences, len(sequences))),
                            num_steps)
        return batch.loss(head, subset_lm_head)

    optimize((p for p in head.parameters() if p.requires_grad), step_loss, steps, lr,
             "Training EAGLE-3 head")
    return head.eval()


@torch.inference_mode()
def eagle3_accuracy(head: Eagle3Head, sequences: list[Sequence],
                    num_steps: int = TTT_STEPS) -> list[float]:
    """Top-1 accuracy of each unrolled step's token against the target's greedy pick there
    (step 1 is the first draft exactly; later steps are the chain's, on the real tokens)."""
    batch = Eagle3Batch(sequences, num_steps)
    truths = [torch.cat([label_tokens(seq, 2 + j)[:len(seq.token_ids) - 1]
                         for seq in sequences]) for j in range(num_steps)]
    accuracy = []
    for j, hidden in enumerate(batch.unrolled(head)):
        mask = batch.masks[j]
        guess = head.draft_token_ids[head.logits(hidden[mask]).argmax(-1)]
        accuracy.append((guess == truths[j][mask]).float().mean().item() if mask.any() else 0.0)
    return accuracy
