"""``octavo generate`` and ``octavo chat``: the engine from a terminal, streaming."""

from __future__ import annotations

from typing import Any

import click

from octavo.config import ConfigError, EngineConfig
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.entrypoints.platform_choice import resolve_platform_or_exit
from octavo.sampling_params import SamplingParams

SAMPLING_OPTIONS = [
    click.option("--max-tokens", type=int, default=256, show_default=True,
                 help="Most tokens to generate."),
    click.option("--temperature", type=float, default=0.0, show_default=True,
                 help="0 = greedy."),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
    click.option("--min-p", type=float, default=0.0, show_default=True),
    click.option("--repetition-penalty", type=float, default=1.0, show_default=True),
    click.option("--stop", multiple=True, help="Stop string (repeatable)."),
]


def sampling_options(command: Any) -> Any:
    for option in reversed(SAMPLING_OPTIONS):
        command = option(command)
    return command


def sampling_params(kwargs: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=kwargs.pop("max_tokens"), temperature=kwargs.pop("temperature"),
            top_p=kwargs.pop("top_p"), top_k=kwargs.pop("top_k"), min_p=kwargs.pop("min_p"),
            repetition_penalty=kwargs.pop("repetition_penalty"),
            stop=list(kwargs.pop("stop")), seed=kwargs.get("seed"))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


class BadModel(click.ClickException):
    """Exit code 2, as for any bad input: a model file or config that cannot be used."""

    exit_code = 2


def make_engine(config: EngineConfig) -> Any:
    """Build a generation engine, turning every user-facing failure into a clean CLI
    error (a model the pooling runner serves among them)."""
    from octavo.engine.errors import InvalidRequestError
    from octavo.engine.llm_engine import LLMEngine
    from octavo.executor.base import WorkerDiedError
    from octavo.models.loader import ModelLoadError

    resolve_platform_or_exit(config.device.backend)
    try:
        engine = LLMEngine(config)
        engine.processor.check_generation()
    except (ModelLoadError, ConfigError) as exc:
        raise BadModel(str(exc)) from None
    except (WorkerDiedError, InvalidRequestError) as exc:
        raise click.ClickException(str(exc)) from None
    return engine


def chat_prompt(engine: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` through the model's chat template, rendered within
    the server's bounds; a template that cannot render them exits 2 in one line."""
    from octavo.entrypoints.openai.chat_template import ChatTemplateError, render_chat

    try:
        text = render_chat(engine.tokenizer, messages)
    except ChatTemplateError as exc:
        raise BadModel(str(exc)) from None
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def stream(engine: Any, prompt: Any, params: SamplingParams) -> str:
    """Run one request, printing its text as it grows; returns the whole text."""
    request_id = engine.add_request(prompt, params)
    shown = 0
    text = ""
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id != request_id:
                continue
            text = output.outputs[0].text
            click.echo(text[shown:], nl=False)
            shown = len(text)
    click.echo()
    return text


@click.command()
@click.argument("prompt")
@click.option("--raw", is_flag=True, help="Complete PROMPT as is, without the chat template.")
@sampling_options
@engine_options
def generate(prompt: str, raw: bool, **kwargs: Any) -> None:
    """Answer PROMPT (through the model's chat template unless --raw) and print the reply."""
    params = sampling_params(kwargs)
    engine = make_engine(build_config(kwargs))
    tokenizer = engine.tokenizer
    if raw or not getattr(tokenizer, "chat_template", None):
        stream(engine, prompt, params)
        return
    stream(engine, {"prompt_token_ids": chat_prompt(
        engine, [{"role": "user", "content": prompt}])}, params)


@click.command()
@click.option("--system", default=None, help="A system message to start the conversation.")
@sampling_options
@engine_options
def chat(system: str | None, **kwargs: Any) -> None:
    """Talk with the model interactively (streaming). An empty line or Ctrl-D quits."""
    params = sampling_params(kwargs)
    engine = make_engine(build_config(kwargs))
    messages = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            user = click.prompt("you", prompt_suffix="> ", default="", show_default=False)
        except (EOFError, click.Abort):
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        ids = chat_prompt(engine, messages)
        click.echo("model> ", nl=False)
        reply = stream(engine, {"prompt_token_ids": ids}, params)
        messages.append({"role": "assistant", "content": reply})
