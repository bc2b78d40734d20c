"""Training Medusa heads (Medusa-1: the target is frozen, only the ResBlocks learn).

Head ``i`` at position ``t`` learns the token at ``t + 2 + i`` from the target's feature
``f_t``; its vocabulary projection stays the target's LM head (Medusa initialises it so;
freezing it keeps training cheap and lets the proposer share the target's LM head). Losses
are weighted ``0.8 ** i`` as in Medusa: later heads are harder and matter less.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from octavo_spec_decode.medusa import MedusaConfig, MedusaHeads
from octavo_spec_decode.train.data import Sequence
from octavo_spec_decode.train.targets import (
    TokenSubset,
    label_tokens,
    on_greedy_path,
    reply_mask,
)


def medusa_examples(sequences: list[Sequence], num_heads: int, subset: TokenSubset,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[N, h]`` of the positions that predict reply tokens, and labels
    ``[N, num_heads]`` (indices into ``subset``, -100 where the sequence has ended)."""
    features, labels = [], []
    for seq in sequences:
        assert seq.features is not None
        keep = reply_mask(seq, 2) & on_greedy_path(seq, 1)
        features.append(seq.features[keep])
        heads = [torch.where(reply_mask(seq, 2 + i) & on_greedy_path(seq, 1 + i),
                             subset.index_of[label_tokens(seq, 2 + i)], -100)[keep]
                 for i in range(num_heads)]
        labels.append(torch.stack(heads, dim=1))
    return torch.cat(features), torch.cat(labels)


def head_logits(heads: MedusaHeads, features: torch.Tensor, lm_head: torch.Tensor,
                subset: TokenSubset) -> torch.Tensor:
    """``[num_heads, N, S]`` logits over the subset through the (frozen) LM head."""
    return subset.logits(heads.features(features), lm_head)


def train_medusa(sequences: list[Sequence], lm_head: torch.Tensor, num_heads: int,
                 num_layers: int, steps: int, seed: int, batch_size: int = 256,
                 lr: float = 3e-3) -> MedusaHeads:
    """Heads trained on random batches of ``batch_size`` positions. A step costs ~0.1 s on
    one core, so many steps are cheap; at lr 3e-3 with one-cycle decay (stable for the
    ResBlocks, unlike EAGLE's decoder layer) 1000-2000 steps reach the held-out plateau."""
    torch.manual_seed(seed)
    vocab_size, hidden_size = lm_head.shape
    heads = MedusaHeads(MedusaConfig(num_heads, num_layers, hidden_size, vocab_size))
    for head in heads:
        head[-1].weight.data.copy_(lm_head)
        head[-1].weight.requires_grad_(False)
    subset = TokenSubset.of(sequences, vocab_size)
    features, labels = medusa_examples(sequences, num_heads, subset)
    params = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps,
                                                   pct_start=0.05)
    weights = torch.tensor([0.8 ** i for i in range(num_heads)])
    generator = torch.Generator().manual_seed(seed)
    with tqdm(range(steps), desc="Training Medusa heads", unit="step",
              dynamic_ncols=True) as bar:
        for _ in bar:
            batch = torch.randint(len(features), (batch_size,), generator=generator)
            logits = head_logits(heads, features[batch], lm_head, subset)
            losses = torch.stack([
                torch.nn.functional.cross_entropy(logits[i], labels[batch, i],
                                                  ignore_index=-100)
                for i in range(num_heads)])
            loss = (weights * losses.nan_to_num()).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return heads.eval()


@torch.inference_mode()
def medusa_accuracy(heads: MedusaHeads, sequences: list[Sequence], lm_head: torch.Tensor,
                    ) -> list[float]:
    """Top-1 accuracy of each head on ``sequences`` (full vocabulary), where the text
    follows greedy decoding (the labels there are what the heads are meant to guess)."""
    num_heads = len(heads)
    correct = torch.zeros(num_heads)
    total = torch.zeros(num_heads)
    for seq in sequences:
        assert seq.features is not None
        drafts = (heads.features(seq.features) @ lm_head.T).argmax(-1)  # [heads, L]
        for i in range(num_heads):
            mask = reply_mask(seq, 2 + i) & on_greedy_path(seq, 1 + i)
            correct[i] += (drafts[i][mask] == label_tokens(seq, 2 + i)[mask]).sum()
            total[i] += mask.sum()
    return (correct / total.clamp(min=1)).tolist()
