"""The training text and the target's features on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from octavo.plugin_api import LLM, CausalLM, SamplingParams, build_model, load_model_files
from octavo_spec_decode.train.dense_attention import DenseCausalBackend, full_sequence_metadata
from octavo_spec_decode.train.errors import TrainingInputError
from octavo_spec_decode.train.prompts import HELD_OUT_PROMPTS
from octavo_spec_decode.train.self_instruct import self_written_requests


@dataclass
class Sequence:
    """One conversation: the chat-formatted prompt and one of the target's replies."""

    token_ids: torch.Tensor  # int64 [L]: prompt + reply
    num_prompt_tokens: int
    features: torch.Tensor | None = None  # [L, hidden]: the target's last hidden states
    # int64 [L]: the target's greedy token after each position - what the heads learn
    # (on a greedy reply it is the reply itself; on a sampled one it is what greedy
    # decoding would have said there).
    next_tokens: torch.Tensor | None = None
    # [L, 3 * hidden]: the hidden states entering three target layers, concatenated (what an
    # EAGLE-3 head reads); kept in bfloat16, which halves the largest part of the data.
    aux_features: torch.Tensor | None = None


SAMPLING_TEMPERATURE = 0.7
AUX_DTYPE = torch.bfloat16


def generate_text(model: str | None, prompts: list[str], max_tokens: int, seed: int,
                  samples_per_prompt: int = 1, self_written: int = 0,
                  dtype: str = "float32") -> list[Sequence]:
    """The target's greedy reply to each prompt, and to ``self_written`` requests it
    writes itself, and ``samples_per_prompt`` sampled ones, through Octavo's own engine.
    Sampled replies multiply the text the heads see (a few hundred prompts give only tens
    of thousands of greedy tokens) while staying the target's own kind of text; their
    labels are still its greedy choices. ``dtype`` is the engine's: in bfloat16 the text
    drifts a little from what fp32 greedy decoding says, but the labels, computed by
    ``add_features`` in fp32, are the fp32 picks all the same."""
    llm = LLM(model=model, dtype=dtype, seed=seed)
    if self_written:
        prompts = prompts + self_written_requests(llm, self_written, seed,
                                                  exclude=(*prompts, *HELD_OUT_PROMPTS))
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    runs = [SamplingParams(temperature=0.0, max_tokens=max_tokens)]
    if samples_per_prompt:
        runs.append(SamplingParams(temperature=SAMPLING_TEMPERATURE, max_tokens=max_tokens,
                                   n=samples_per_prompt))
    return [Sequence(torch.tensor(list(o.prompt_token_ids) + list(c.token_ids)),
                     len(o.prompt_token_ids))
            for params in runs for o in llm.chat(conversations, params) for c in o.outputs]


def load_target(model: str | None) -> tuple[CausalLM, dict]:
    """The target in fp32 with cache-free attention, for full-sequence forwards, and its
    HF config."""
    files = load_model_files(model)
    return build_model(files, torch.float32, DenseCausalBackend, "cpu"), files.hf_config


@torch.inference_mode()
def add_features(target: CausalLM, sequences: list[Sequence], batch_tokens: int = 2048,
                 aux_layers: tuple[int, ...] = ()) -> None:
    """Fill ``features`` (the target's final hidden states) and ``next_tokens`` (its greedy
    picks), a few sequences a forward; with ``aux_layers``, ``aux_features`` too."""
    batches: list[list[Sequence]] = [[]]
    for seq in sequences:
        if batches[-1] and sum(len(s.token_ids) for s in batches[-1]) + len(seq.token_ids) \
                > batch_tokens:
            batches.append([])
        batches[-1].append(seq)
    for batch in tqdm(batches, desc="Target features", unit="batch", dynamic_ncols=True):
        lengths = [len(s.token_ids) for s in batch]
        ids = torch.cat([s.token_ids for s in batch])
        positions = torch.cat([torch.arange(n) for n in lengths])
        kv_caches = [torch.empty(0)] * target.num_layers
        target.model.aux_hidden_state_layers = frozenset(aux_layers)
        hidden = target(ids, positions, kv_caches, full_sequence_metadata(lengths, ids.device))
        next_tokens = target.compute_logits(hidden).argmax(-1)
        aux = (torch.cat(target.model.aux_hidden_states, dim=-1)
               .to(AUX_DTYPE).split(lengths) if aux_layers else [None] * len(batch))
        for seq, features, picks, aux_features in zip(batch, hidden.split(lengths),
                                                      next_tokens.split(lengths), aux):
            seq.features = features.clone()
            seq.next_tokens = picks.clone()
            seq.aux_features = None if aux_features is None else aux_features.clone()
    target.model.aux_hidden_state_layers = frozenset()


def save_data(path: Path, model: str | None, sequences: list[Sequence],
              aux_layers: tuple[int, ...] = ()) -> None:
    """Keep text and features (and the aux features of ``aux_layers``, if any), so heads
    of another kind can train without regenerating."""
    torch.save({"model": model or "", "aux_layers": list(aux_layers), "sequences": [
        {"token_ids": s.token_ids, "num_prompt_tokens": s.num_prompt_tokens,
         "features": s.features, "next_tokens": s.next_tokens,
         "aux_features": s.aux_features} for s in sequences]}, path)


def load_data(path: Path, model: str | None, aux_layers: tuple[int, ...] = ()) -> list[Sequence]:
    """The sequences of a ``save_data`` file; their aux features only if they are those of
    ``aux_layers`` (an older file, or one of other layers, gives none)."""
    data = torch.load(path, weights_only=True)
    same_aux = bool(aux_layers) and tuple(data.get("aux_layers") or ()) == tuple(aux_layers)
    if data.get("model") != (model or ""):
        raise TrainingInputError(f"{path}: holds data of model {data.get('model') or 'default'!r}, "
                         f"not {model or 'default'!r}")
    if any(s.get("next_tokens") is None for s in data["sequences"]):
        raise TrainingInputError(f"{path}: written by an older `octavo spec train` (no greedy "
                         f"labels); delete it to regenerate")
    return [Sequence(s["token_ids"], s["num_prompt_tokens"], s["features"], s["next_tokens"],
                     s.get("aux_features") if same_aux else None)
            for s in data["sequences"]]
