"""``octavo spec``: speculative-decoding tools; ``octavo spec train`` trains heads.

The module is imported when ``octavo`` starts, so it defines the commands only; torch and
the training code load when a command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from octavo_spec_decode.train import defaults
from octavo_spec_decode.train.errors import TrainingInputError

METHODS = ("medusa", "eagle", "eagle3")


@click.group("spec")
def spec() -> None:
    """Speculative decoding: train Medusa / EAGLE / EAGLE-3 heads for a model."""


@spec.command("train")
@click.option("--method", type=click.Choice(METHODS), required=True,
              help="Kind of head to train.")
@click.option("--model", default=None,
              help="Target model (HF folder or .gguf); default: SmolLM2-135M-Instruct.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Folder to write the heads to (published layout + config.json).")
@click.option("--num-heads", "--k", "num_heads", type=click.IntRange(1, 8), default=3,
              show_default=True, help="Medusa heads = most drafts per step (k).")
@click.option("--steps", type=click.IntRange(1), default=None,
              help="Optimizer steps [default: " + ", ".join(
                  f"{n} for {m}" for m, n in defaults.STEPS.items()) + "].")
@click.option("--prompts", "num_prompts", type=click.IntRange(0), default=defaults.NUM_PROMPTS,
              show_default=True, help="How many built-in training prompts the target answers.")
@click.option("--self-written", type=click.IntRange(0), default=defaults.SELF_WRITTEN,
              show_default=True,
              help="How many requests the target writes itself (Magpie) and answers too.")
@click.option("--medusa-layers", type=click.IntRange(1), default=defaults.MEDUSA_LAYERS,
              show_default=True, help="ResBlocks per Medusa head.")
@click.option("--samples-per-prompt", type=click.IntRange(0), default=0, show_default=True,
              help="Sampled replies per prompt (temperature 0.7) besides the greedy one.")
@click.option("--max-tokens", type=click.IntRange(1), default=160, show_default=True,
              help="Length of each generated reply.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--data", type=click.Path(dir_okay=False), default=None,
              help="File for the generated text and features: reused when it exists, "
                   "written otherwise (train Medusa and EAGLE from one generation).")
@click.option("--eval/--no-eval", "evaluate", default=True, show_default=True,
              help="Measure tokens per verification step on held-out prompts at the end.")
def train(method: str, model: str | None, out: str, num_heads: int, steps: int | None,
          num_prompts: int, self_written: int, medusa_layers: int, samples_per_prompt: int,
          max_tokens: int, seed: int, data: str | None, evaluate: bool) -> None:
    """Self-distil heads from the target: it answers built-in instructions and requests it
    writes itself, its features on its own replies are recorded, and the heads learn to
    predict what it says next."""
    if num_prompts + self_written == 0 and not (data and Path(data).is_file()):
        raise click.UsageError("--prompts 0 and --self-written 0 leave no text to train on")
    from octavo_spec_decode.train.run import TrainOptions, train_heads

    options = TrainOptions(method=method, model=model, out=out, num_heads=num_heads,
                           steps=steps, num_prompts=num_prompts, self_written=self_written,
                           medusa_layers=medusa_layers,
                           samples_per_prompt=samples_per_prompt, max_tokens=max_tokens,
                           seed=seed, evaluate=evaluate, data=data)
    try:
        report = train_heads(options)
    except TrainingInputError as error:
        raise click.ClickException(str(error)) from error
    click.echo(report)
