"""``octavo serve``: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from octavo.config import EngineConfig
from octavo.engine.dp_handshake import SECRET_ENV
from octavo.engine.errors import EngineDeadError, EngineStartError
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.entrypoints.openai.settings import DEFAULT_MODEL_NAME, ServerSettings
from octavo.entrypoints.platform_choice import resolve_platform_or_exit


class MemorySize(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        from octavo.config import ConfigError
        from octavo.config.parse import parse_memory

        try:
            return parse_memory(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class NameList(click.ParamType):
    """Comma-separated names, or a JSON list of them (vLLM's spelling of the CORS flags)."""

    name = "names"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        if not text.startswith("["):
            return tuple(name.strip() for name in text.split(",") if name.strip())
        try:
            names = json.loads(text)
        except json.JSONDecodeError as exc:
            self.fail(f"not a JSON list: {exc}", param, ctx)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            self.fail("must be a list of strings", param, ctx)
        return tuple(names)


def _lora_modules(ctx: click.Context, param: click.Parameter,
                  values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``NAME=PATH`` pairs as ``(name, path)``."""
    del ctx, param
    modules = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{value!r} is not NAME=PATH",
                                     param_hint="--lora-modules")
        modules.append((name, path))
    return tuple(modules)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")
@click.option("--api-key", envvar="OCTAVO_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on the API routes "
                   "(or set OCTAVO_API_KEY).")
@click.option("--served-model-name", default=None,
              help="The model name clients use (default: the --model path, or "
                   f"{DEFAULT_MODEL_NAME} for the default model).")
@click.option("--lora-modules", multiple=True, metavar="NAME=PATH", callback=_lora_modules,
              help="Serve the PEFT LoRA adapter in folder PATH as model NAME (with "
                   "--enable-lora; repeat the flag for several).")
@click.option("--max-waiting-requests", type=click.IntRange(min=1), default=None,
              help="Answer 503 with Retry-After when a request would bring the sequences "
                   "(prompts x n) waiting for their first token above this many (default: "
                   "no cap); a request of more sequences than this is a 400.")
@click.option("--max-sequences-per-request", type=click.IntRange(min=1), default=4096,
              show_default=True,
              help="A request creating more sequences (prompts x n) is a 400.")
@click.option("--request-sequence-window", type=click.IntRange(min=1), default=64,
              show_default=True,
              help="At most this many sequences of one request are in the engine at once "
                   "(at least one prompt's n); the rest wait, so that requests behind it "
                   "do not wait for all of it.")
@click.option("--engine-stall-timeout", type=click.FloatRange(min=0), default=300.0,
              show_default=True,
              help="Seconds an engine with work may go without finishing a step before "
                   "/health answers 503 (0: never). Keep it above the longest honest step "
                   "(a full prefill chunk of a large model on a CPU).")
@click.option("--engine-stall-action", type=click.Choice(["keep", "fail"]), default="keep",
              show_default=True,
              help="What a stall does to the requests in flight: keep them waiting for the "
                   "engine, or fail them with an error.")
@click.option("--allowed-hosts", type=NameList(), default=None,
              help="Host names (any port) the server answers for; others get 400 (\"*\": "
                   "any). Default: on a loopback address, localhost, 127.0.0.1, [::1] and "
                   "the --host; on any other address, any.")
@click.option("--allowed-origins", type=NameList(), default="",
              help="Turn CORS on for these origins (\"*\": any). Default: CORS off.")
@click.option("--allowed-methods", type=NameList(), default="*", show_default=True,
              help="The methods CORS allows (with --allowed-origins).")
@click.option("--allowed-headers", type=NameList(), default="*", show_default=True,
              help="The request headers CORS allows (with --allowed-origins).")
@click.option("--allow-credentials", is_flag=True, default=False,
              help="Let CORS requests carry credentials (with --allowed-origins).")
@click.option("--disable-fastapi-docs", "--disable-docs", "disable_docs", is_flag=True,
              default=False,
              help="Serve no /docs, /redoc or /openapi.json (with --api-key, they need the key).")
@click.option("--disable-playground", is_flag=True, default=False,
              help="Serve no web playground at / and /playground.")
@click.option("--max-request-body-size", "max_request_body_size", type=MemorySize(),
              default="8MiB", show_default=True,
              help="Answer 413 to a request body larger than this.")
@click.option("--max-inflight-body-size", "max_inflight_body_size", type=MemorySize(),
              default=None,
              help="Answer 503 with Retry-After to a request whose body would take the bytes "
                   "of the request bodies being processed at once past this (default: the "
                   "machine's memory / 1536, at least --max-request-body-size).")
@click.option("--body-timeout", "body_timeout_s", type=click.FloatRange(min=0, min_open=True),
              default=30.0, show_default=True,
              help="Seconds to receive a request's body, else 408.")
@click.option("--header-timeout", "header_timeout_s",
              type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds for a connection to send a request's headers, else it is closed "
                   "(slow clients cannot hold connections).")
@click.option("--max-connections", "max_connections", type=click.IntRange(min=1),
              default=None, help="Close new connections past this many open ones "
                                 "(default: the file-descriptor limit, less a reserve).")
@click.option("--shutdown-timeout", "shutdown_timeout_s", type=click.FloatRange(min=0),
              default=30.0, show_default=True,
              help="On SIGTERM, seconds running requests get to finish; then they end with "
                   "an error (streams: an error event and [DONE]).")
@click.option("--restart-engine", "restart_engine", is_flag=True, default=False,
              help="Restart the engine core (with backoff) when it dies, instead of exiting "
                   "non-zero for a supervisor to restart the server.")
@click.option("--chat-template", "chat_template", default=None,
              help="The chat template: a file, or the template text itself (default: the "
                   "model's own). Tool-aware templates are in examples/.")
@click.option("--trust-request-chat-template", is_flag=True, default=False,
              help="Let requests bring their own chat_template (a template is a program: "
                   "only for trusted clients).")
@click.option("--enable-auto-tool-choice", is_flag=True, default=False,
              help='Serve tool_choice "auto" (the default when tools are given): the reply '
                   "is free text until the model opens a call, whose arguments then follow "
                   "the tool's schema. Needs --tool-call-parser.")
@click.option("--tool-call-parser", default=None,
              help="The format of the model's tool calls: hermes, llama3_json, mistral, "
                   "pythonic, or one a plugin registers.")
@click.option("--reasoning-parser", default=None,
              help="Split the reply's <think>...</think> off as message.reasoning: "
                   "deepseek_r1, qwen3, or one a plugin registers.")
@click.option("--max-stored-responses", type=click.IntRange(min=0), default=1000,
              show_default=True,
              help="/v1/responses answers kept for previous_response_id (oldest forgotten "
                   "first; 0: none).")
@click.option("--headless", is_flag=True, default=False,
              help="Run this node's data-parallel engines (--data-parallel-size-local, "
                   "--data-parallel-start-rank) for the front end at --data-parallel-address "
                   "and --data-parallel-rpc-port, and no HTTP server.")
@click.option("--data-parallel-secret", envvar=SECRET_ENV, default=None,
              help="The secret that authenticates headless engines to the front end (the "
                   f"same on every node; or set {SECRET_ENV}).")
@engine_options
def serve(served_model_name: str | None, headless: bool, data_parallel_secret: str | None,
          **kwargs: Any) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    from octavo.entrypoints.openai.api_server import run_server

    config = build_config(kwargs)
    if config.device.backend != "auto":  # "auto" always resolves (the CPU at least); checking it
        # here would import the whole model stack before the engine core is even spawned
        resolve_platform_or_exit(config.device.backend)
    secret = _data_parallel_secret(config, headless, data_parallel_secret)
    if headless:
        _serve_headless(config, secret)
        return
    if kwargs["restart_engine"] and _has_remote_engines(config):
        raise click.UsageError("--restart-engine restarts the engines of this node; it is not "
                               "available with engines on headless nodes")
    _check_chat_flags(kwargs)
    # The flags left once the engine's are taken are ServerSettings' fields, by name.
    settings = ServerSettings(
        served_model_name=served_model_name or config.model.model or DEFAULT_MODEL_NAME,
        **kwargs)
    from octavo.entrypoints.openai.chat_template import ChatTemplateError

    try:
        asyncio.run(run_server(config, settings, secret))
    except (EngineStartError, EngineDeadError, ChatTemplateError) as exc:
        raise click.ClickException(str(exc)) from None  # exit code 1


def _check_chat_flags(kwargs: dict[str, Any]) -> None:
    """Fail at start on a chat flag that cannot work; the template becomes its text."""
    from octavo.entrypoints.openai.chat_template import ChatTemplateError, load_chat_template
    from octavo.entrypoints.openai.reasoning_parsers import get_reasoning_parser
    from octavo.entrypoints.openai.tool_parsers import get_tool_parser

    if kwargs["enable_auto_tool_choice"] and not kwargs["tool_call_parser"]:
        raise click.UsageError("--enable-auto-tool-choice needs --tool-call-parser (the "
                               "format of the model's tool calls)")
    for flag, find in (("tool_call_parser", get_tool_parser),
                       ("reasoning_parser", get_reasoning_parser)):
        if kwargs[flag] is not None:
            try:
                find(kwargs[flag])
            except ValueError as exc:
                raise click.BadParameter(str(exc),
                                         param_hint=f"--{flag.replace('_', '-')}") from None
    try:
        kwargs["chat_template"] = load_chat_template(kwargs["chat_template"])
    except ChatTemplateError as exc:
        raise click.BadParameter(str(exc), param_hint="--chat-template") from None


def _has_remote_engines(config: EngineConfig) -> bool:
    return config.parallel.data_parallel_size_local != config.parallel.data_parallel_size


def _data_parallel_secret(config: EngineConfig, headless: bool,
                          secret: str | None) -> bytes | None:
    """The secret, required wherever engines hand-shake across nodes."""
    if not (headless or _has_remote_engines(config)):
        return None
    if not secret:
        raise click.UsageError(f"engines on headless nodes hand-shake with a shared secret: "
                               f"give --data-parallel-secret (or set {SECRET_ENV}), the same "
                               "on every node")
    return secret.encode()


def _serve_headless(config: EngineConfig, secret: bytes | None) -> None:
    """Run the engines; exit with their code (1 if one failed or the front end vanished)."""
    from octavo.engine.headless import run_headless
    from octavo.models.loader import default_model_path

    assert secret is not None
    if config.parallel.data_parallel_size_local == 0:
        raise click.UsageError("--headless with --data-parallel-size-local 0 runs no engine")
    model = Path(config.model.model) if config.model.model else default_model_path()
    try:
        code = run_headless(config, secret, model)
    except EngineStartError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
