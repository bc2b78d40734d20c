"""Training an EAGLE-1 head: feature regression plus token cross-entropy, as in the paper.

At position ``p`` the head reads ``(f_p, x_{p+1})`` and learns ``f_{p+1}`` (smooth L1) and,
through the target's frozen LM head, the token ``x_{p+2}`` (cross-entropy). At inference
the second and later drafts read the head's *own* predicted features, so training unrolls
``passes`` rounds: in round ``j`` the reply positions read round ``j - 1``'s predictions
instead of the target's features, which teaches the head to correct its own errors.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import nn

from octavo.plugin_api import CausalLM
from octavo_spec_decode.eagle import EagleHead, head_config
from octavo_spec_decode.projection import lm_head_weight
from octavo_spec_decode.train.data import Sequence
from octavo_spec_decode.train.dense_attention import DenseCausalBackend, full_sequence_metadata
from octavo_spec_decode.train.optimize import optimize
from octavo_spec_decode.train.targets import TokenSubset, label_tokens, reply_mask

# Weight of the token loss against the feature loss. The paper's 0.1 suits a 7B target
# trained on ShareGPT; on SmolLM2-135M's few tens of thousands of tokens the drafted token is
# what counts, and 1.0 gave a slightly better first-draft accuracy at the same cost.
CLS_WEIGHT = 1.0


def new_eagle_head(target: CausalLM) -> EagleHead:
    """An untrained head shaped like one of the target's layers (HF's Llama init)."""
    head = EagleHead(head_config(target.config), True, DenseCausalBackend,
                     target.model.embed_tokens)
    init_like_llama(head)
    return head


def init_like_llama(head: nn.Module) -> None:
    """HF's Llama initialisation, every parameter trainable: norms 1, biases 0, matrices
    normal with std 0.02."""
    for name, param in head.named_parameters():
        param.requires_grad_(True)
        if param.dim() == 1:
            nn.init.ones_(param) if "norm" in name else nn.init.zeros_(param)
        else:
            nn.init.normal_(param, std=0.02)


class EagleBatch:
    """Sequences flattened back to back: the head's inputs, targets and masks."""

    def __init__(self, sequences: list[Sequence], subset: TokenSubset) -> None:
        lengths, feats, toks, pos, target, labels, reg, replace = ([] for _ in range(8))
        for seq in sequences:
            assert seq.features is not None
            n = len(seq.token_ids) - 1  # entries p = 0 .. L-2
            lengths.append(n)
            feats.append(seq.features[:n])
            toks.append(seq.token_ids[1:])
            pos.append(torch.arange(n))
            target.append(seq.features[1:])
            label_ok = reply_mask(seq, 2)[:n]
            labels.append(torch.where(label_ok, subset.index_of[label_tokens(seq, 2)[:n]],
                                      -100))
            reg.append(reply_mask(seq, 1)[:n])
            replace.append(reply_mask(seq, 0)[:n])
        self.lengths = lengths
        self.features, self.tokens, self.positions = (torch.cat(x) for x in (feats, toks, pos))
        self.target, self.labels = torch.cat(target), torch.cat(labels)
        self.regress, self.replace = torch.cat(reg), torch.cat(replace)
        self.metadata = full_sequence_metadata(lengths, self.features.device)

    def predict(self, head: EagleHead, features: torch.Tensor) -> torch.Tensor:
        return head(features, self.tokens, self.positions, [torch.empty(0)], self.metadata)

    def unrolled(self, head: EagleHead, passes: int) -> list[torch.Tensor]:
        """Predictions of each round; round j's reply inputs are round j-1's predictions."""
        predictions = [self.predict(head, self.features)]
        for _ in range(passes - 1):
            shifted = torch.cat([self.features[:1], predictions[-1][:-1]])
            inputs = torch.where(self.replace[:, None], shifted, self.features)
            predictions.append(self.predict(head, inputs))
        return predictions


def train_eagle(target: CausalLM, sequences: list[Sequence], steps: int, seed: int,
                passes: int = 2, batch_sequences: int = 8, lr: float = 1e-3) -> EagleHead:
    """A head trained for ``steps`` steps of ``batch_sequences`` whole sequences each (8 of
    ~190 tokens: enough tokens a step for a stable gradient, ~0.8 s a step on one core)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    head = new_eagle_head(target)
    lm_head = lm_head_weight(target)
    subset = TokenSubset.of(sequences, lm_head.shape[0])

    def step_loss() -> torch.Tensor:
        batch = EagleBatch(rng.sample(sequences, min(batch_sequences, len(sequences))),
                           subset)
        loss = torch.zeros(())
        for predicted in batch.unrolled(head, passes):
            regression = F.smooth_l1_loss(predicted[batch.regress],
                                          batch.target[batch.regress])
            scored = batch.labels != -100  # the LM-head product only where it counts
            if scored.any():
                loss = loss + CLS_WEIGHT * F.cross_entropy(
                    subset.logits(predicted[scored], lm_head), batch.labels[scored])
            loss = loss + regression
        return loss

    optimize((p for p in head.parameters() if p.requires_grad), step_loss, steps, lr,
             "Training EAGLE head")
    head.draft_token_ids = subset.token_ids  # drafts pick among the tokens the target used
    return head.eval()


@torch.inference_mode()
def eagle_accuracy(head: EagleHead, target: CausalLM, sequences: list[Sequence],
                   passes: int = 3) -> list[float]:
    """Top-1 accuracy of each unrolled round's token guess on ``sequences`` (round 1 is the
    first draft exactly; later rounds approximate later drafts)."""
    subset = TokenSubset.of(sequences, lm_head_weight(target).shape[0])
    batch = EagleBatch(sequences, subset)
    mask = batch.labels != -100
    truth = subset.token_ids[batch.labels[mask]]
    return [(target.compute_logits(p[mask]).argmax(-1) == truth).float().mean().item()
            for p in batch.unrolled(head, passes)]
