"""For the EOS and generation-config tests: HF transformers' greedy continuations of a
tiny random model (the reference), where a set of stop ids would cut them, stop ids the
model actually produces, and copies of the model folder with other EOS ids and
generation_config.json files."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .tiny_models import BOS_ID, EOS_ID, PAD_ID

SPECIAL_IDS = {BOS_ID, EOS_ID, PAD_ID}


@torch.no_grad()
def hf_greedy(model: PreTrainedModel, prompts: list[list[int]], num_tokens: int,
              ) -> list[list[int]]:
    """Each prompt's greedy continuation, with no EOS: argmax of HF's full forward pass."""
    continuations = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(num_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
        continuations.append(ids[len(prompt):])
    return continuations


def first_stop(tokens: list[int], stop_ids: set[int]) -> int | None:
    """Where ``tokens`` would stop: the index of the first stop id, or None."""
    return next((i for i, token in enumerate(tokens) if token in stop_ids), None)


def stopped(tokens: list[int], stop_ids: set[int], limit: int) -> list[int]:
    """``tokens`` cut after the first stop id (kept, as engines report it), at most ``limit``."""
    end = first_stop(tokens[:limit], stop_ids)
    return tokens[:limit] if end is None else tokens[:end + 1]


def pick_stop_ids(greedy: list[list[int]], count: int, rng: random.Random,
                  limit: int) -> list[int]:
    """``count`` distinct ids, none special, such that each is the first of them (and of
    the model's EOS) to come in at least one continuation (within ``limit`` tokens),
    preferably after its first token."""
    candidates = sorted({t for tokens in greedy for t in tokens[:limit]} - SPECIAL_IDS)
    best: list[int] | None = None
    for _ in range(5000):
        ids = rng.sample(candidates, count)
        firsts = [first_stop(tokens[:limit], {*ids, EOS_ID}) for tokens in greedy]
        hit = {greedy[i][pos] for i, pos in enumerate(firsts) if pos is not None} - {EOS_ID}
        if hit != set(ids):
            continue
        if all(pos is None or pos > 0 for pos in firsts):
            return ids
        best = best or ids
    assert best is not None, f"no {count} ids each end a continuation: {greedy}"
    return best


def model_copy(source: Path, folder: Path, eos_token_id: Any = None,
               generation_config: dict[str, Any] | None = None) -> Path:
    """``source`` copied to ``folder``, with config.json's ``eos_token_id`` replaced (if
    given) and generation_config.json replaced (if given; HF wrote one with the EOS)."""
    shutil.copytree(source, folder)
    if eos_token_id is not None:
        config = json.loads((folder / "config.json").read_text())
        config["eos_token_id"] = eos_token_id
        (folder / "config.json").write_text(json.dumps(config))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder
