"""Engine flags shared by ``octavo serve``, ``generate``, ``chat`` and ``bench``, generated
from the config's fields (``octavo.config.engine.flat_fields``): a flag's name, default,
type and help are the field's, so each is written once. Names follow vLLM's."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

import click

from octavo.config import ConfigError, EngineConfig
from octavo.config.engine import flat_fields

# The JSON parts: one flag each, taking JSON text.
JSON_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--kv-transfer-config", default=None,
                 help='KV connector as JSON, e.g. \'{"connector": "shared_storage", '
                      '"role": "producer", "path": "/tmp/kv"}\' (disaggregated serving).'),
    click.option("--speculative-config", default=None,
                 help='Speculative decoding as JSON, e.g. \'{"method": "ngram", '
                      '"num_speculative_tokens": 4}\' (methods: ngram, draft_model, medusa, '
                      'eagle, eagle3, or a plugin\'s; the draft model and heads need "model").'),
    click.option("--structured-outputs-config", default=None,
                 help='Guided decoding as JSON, e.g. \'{"max_cached_grammars": 512}\'.'),
    click.option("--pooler-config", default=None,
                 help='Pooling (--runner pooling) as JSON, e.g. \'{"pooling_type": "MEAN", '
                      '"use_activation": true, "dimensions": 256}\'; default: the model\'s.'),
    click.option("-O", "--compilation-config", "compilation_config", default=None,
                 help='torch.compile the model\'s forward: a level (-O3; -O0, the default, '
                      'runs eager) or JSON, e.g. \'{"level": 3, "cache_dir": "/tmp/ind"}\'. '
                      'CPU backend only; --enforce-eager overrides it.'),
]
JSON_KEYS = ("kv_transfer_config", "speculative_config", "structured_outputs_config",
             "pooler_config", "compilation_config")


def _click_type(field: dataclasses.Field[Any]) -> Any:
    """The click type of a field: its choices, else the non-None member of its annotation."""
    if "choices" in field.metadata:
        return click.Choice(list(field.metadata["choices"]))
    if "parse" in field.metadata:
        return str  # parsed by the field's own function (memory sizes)
    hint = typing.get_type_hints(_owner(field))[field.name]
    if isinstance(hint, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint


def _owner(field: dataclasses.Field[Any]) -> type:
    from octavo.config.engine import PARTS

    return next(cls for cls in PARTS.values()
                if field.name in {f.name for f in dataclasses.fields(cls)})


def _option(field: dataclasses.Field[Any]) -> Callable[[Any], Any]:
    flag = "--" + field.name.replace("_", "-")
    help_text = field.metadata["help"]
    if field.type in (bool, "bool"):
        if field.default:
            return click.option(f"{flag}/--no-{field.name.replace('_', '-')}", default=True,
                                show_default=True, help=help_text)
        return click.option(flag, is_flag=True, default=False, help=help_text)
    if field.type == "bool | None":  # unset (None): the config settles it (its help says how)
        return click.option(f"{flag}/--no-{field.name.replace('_', '-')}", default=None,
                            help=help_text)
    names = [flag, field.metadata["alias"]] if "alias" in field.metadata else [flag]
    return click.option(*names, field.name, type=_click_type(field), default=field.default,
                        show_default=field.default is not None, help=help_text)


def engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add every engine flag to a click command."""
    options = [_option(f) for _, f in flat_fields() if "help" in f.metadata] + JSON_OPTIONS
    for option in reversed(options):
        command = option(command)
    return command


def pop_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the engine flags out of a command's keyword arguments, parsed."""
    engine: dict[str, Any] = {key: kwargs.pop(key) for key in JSON_KEYS}
    for _, field in flat_fields():
        if "help" not in field.metadata:
            continue
        value = kwargs.pop(field.name)
        parse = field.metadata.get("parse")
        if parse is not None and value is not None:
            try:
                value = parse(value)
            except ConfigError as exc:
                flag = "--" + field.name.replace("_", "-")
                raise click.BadParameter(str(exc), param_hint=flag) from None
        engine[field.name] = value
    return engine


def build_config(kwargs: dict[str, Any]) -> EngineConfig:
    """The engine config of a command's flags; a bad value or an unregistered name is a
    usage error, before any model is loaded."""
    from octavo.plugins import get_registries
    from octavo.plugins.resolve import check_names

    try:
        config = EngineConfig.from_kwargs(**pop_engine_kwargs(kwargs))
        check_names(config, get_registries())
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    return config
