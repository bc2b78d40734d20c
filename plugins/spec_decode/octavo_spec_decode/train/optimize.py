"""The optimisation loop every trainer shares: AdamW, one-cycle learning rate, a progress bar
with the running loss. Trainers differ only in how one step's loss is computed."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from tqdm.auto import tqdm

# Decay between a head's successive drafts' losses (Medusa's heads, EAGLE-3's unrolled steps).
STEP_WEIGHT = 0.8


def optimize(params: Iterable[torch.nn.Parameter], step_loss: Callable[[], torch.Tensor],
             steps: int, lr: float, desc: str) -> None:
    """``steps`` AdamW steps (no weight decay) on ``step_loss()``, the rate warming up over
    the first 5% and annealing after (one-cycle)."""
    optimizer = torch.optim.AdamW(list(params), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps,
                                                   pct_start=0.05)
    with tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True) as bar:
        for _ in bar:
            loss = step_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")


def distillation(logits: torch.Tensor, teacher_features: torch.Tensor,
                 lm_head: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``logits`` against the target's own distribution, computed from its
    final hidden states ``teacher_features`` through ``lm_head`` (no gradient through it)."""
    with torch.no_grad():
        teacher = torch.softmax(teacher_features @ lm_head.T, dim=-1)
    return torch.nn.functional.cross_entropy(logits, teacher)
