"""``octavo spec train`` end to end: text, features, training, saving, measuring."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.plugin_api import CausalLM
from octavo_spec_decode.eagle import save_eagle
from octavo_spec_decode.eagle3 import default_aux_layers, save_eagle3
from octavo_spec_decode.medusa import save_medusa
from octavo_spec_decode.projection import lm_head_weight
from octavo_spec_decode.train import defaults
from octavo_spec_decode.train.data import (
    Sequence,
    add_features,
    generate_text,
    load_data,
    load_target,
    save_data,
)
from octavo_spec_decode.train.eagle3_train import eagle3_accuracy, train_eagle3
from octavo_spec_decode.train.eagle_train import eagle_accuracy, train_eagle
from octavo_spec_decode.train.errors import TrainingInputError
from octavo_spec_decode.train.evaluate import measure_acceptance
from octavo_spec_decode.train.medusa_train import medusa_accuracy, train_medusa
from octavo_spec_decode.train.prompts import HELD_OUT_PROMPTS, training_prompts
from octavo_spec_decode.train.targets import split

# The engine's dtype for writing the text: on the CPU bfloat16 runs at ~1.6x fp32's speed
# (690 against 430 tok/s at 128 replies), and the labels are recomputed in fp32 anyway.
GENERATION_DTYPE = "auto"


@dataclass(frozen=True)
class TrainOptions:
    method: str  # "medusa", "eagle" or "eagle3"
    model: str | None  # None: the default SmolLM2-135M-Instruct
    out: str
    num_heads: int = 3  # Medusa heads; for EAGLE, the k of the final measurement
    steps: int | None = None  # None: defaults.STEPS[method]
    num_prompts: int = defaults.NUM_PROMPTS
    self_written: int = defaults.SELF_WRITTEN  # requests the target writes itself
    medusa_layers: int = defaults.MEDUSA_LAYERS
    samples_per_prompt: int = 0  # sampled replies besides the greedy one
    max_tokens: int = 160
    seed: int = 0
    evaluate: bool = True
    data: str | None = None  # file of generated text + features: reused if it exists


def train_heads(options: TrainOptions) -> str:
    """Train, save to ``options.out`` and return a short report."""
    started = time.perf_counter()
    torch.manual_seed(options.seed)
    target, hf_config = load_target(options.model)
    aux_layers = aux_layers_for(options.method, target)
    sequences = training_data(options, target, aux_layers)
    train_set, eval_set = split(sequences)
    steps = options.steps or defaults.STEPS[options.method]
    lm_head = lm_head_weight(target)
    if options.method == "medusa":
        heads = train_medusa(train_set, lm_head, options.num_heads, options.medusa_layers, steps,
                             seed=options.seed)
        save_medusa(heads, options.out, base_model=options.model or "SmolLM2-135M-Instruct")
        accuracy = medusa_accuracy(heads, eval_set, lm_head)
    elif options.method == "eagle3":
        head3 = train_eagle3(target, train_set, steps=steps, seed=options.seed)
        save_eagle3(head3, options.out, hf_config, aux_layers)
        accuracy = eagle3_accuracy(head3, eval_set)
    else:
        head = train_eagle(target, train_set, steps=steps, seed=options.seed)
        save_eagle(head, options.out, hf_config)
        accuracy = eagle_accuracy(head, target, eval_set)
    lines = [f"{options.method} heads written to {Path(options.out)} "
             f"({len(train_set)} training replies, {steps} steps, "
             f"{time.perf_counter() - started:.0f} s)",
             "top-1 accuracy per draft position on held-back replies (teacher-forced): "
             + ", ".join(f"{a:.2f}" for a in accuracy)]
    if options.evaluate:
        lines += [measure_acceptance(options.model, options.method, options.out,
                                     options.num_heads, list(HELD_OUT_PROMPTS),
                                     options.max_tokens, tree).summary()
                  for tree in evaluation_trees(options)]
    return "\n".join(lines)


def evaluation_trees(options: TrainOptions) -> list[list[list[int]] | None]:
    """The plain chain, and for Medusa the default token tree cut to the heads' depth."""
    if options.method != "medusa":
        return [None]
    tree = [list(path) for path in defaults.MEDUSA_TREE if len(path) <= options.num_heads]
    return [None, tree]


def aux_layers_for(method: str, target: CausalLM) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads (vLLM's default three); none otherwise."""
    if method != "eagle3":
        return ()
    num_layers = target.config.num_hidden_layers
    layers = default_aux_layers(num_layers)
    if len(set(layers)) != len(layers) or min(layers) < 0:
        raise TrainingInputError(f"the target has {num_layers} layers: EAGLE-3's aux layers "
                                 f"{layers} (2, L // 2, L - 3) are not three distinct ones; "
                                 f"it needs a target of 7 layers or more")
    return layers


def training_data(options: TrainOptions, target: CausalLM,
                  aux_layers: tuple[int, ...] = ()) -> list[Sequence]:
    """The target's replies to the training prompts with its features (and the aux
    features of ``aux_layers``), from ``options.data`` when that file exists (and written
    there otherwise; a file without those aux features gets them added)."""
    if options.data and Path(options.data).is_file():
        sequences = load_data(Path(options.data), options.model, aux_layers)
        if aux_layers and any(s.aux_features is None for s in sequences):
            add_features(target, sequences, aux_layers=aux_layers)
            save_data(Path(options.data), options.model, sequences, aux_layers)
        return sequences
    prompts = training_prompts()
    if options.num_prompts > len(prompts):
        raise TrainingInputError(f"--prompts {options.num_prompts}: only {len(prompts)} built-in "
                         f"training prompts exist")
    sequences = generate_text(options.model, prompts[:options.num_prompts], options.max_tokens,
                              options.seed, options.samples_per_prompt, options.self_written,
                              dtype=GENERATION_DTYPE)
    add_features(target, sequences, aux_layers=aux_layers)
    if options.data:
        save_data(Path(options.data), options.model, sequences, aux_layers)
    return sequences
