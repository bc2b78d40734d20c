"""From a constraint to an xgrammar grammar: the one place that knows how each kind of
``StructuredOutputsParams`` is spelled for xgrammar.

A constraint is named by ``(kind, spec)`` (``StructuredOutputsParams.kind`` and ``.spec``):
plain strings, so they key caches and travel anywhere.

JSON is generated compact (no free whitespace between tokens): a small model allowed any
whitespace may loop on newlines until it runs out of tokens, and compact JSON is also
fewer tokens.
"""

from __future__ import annotations

import functools
import json
import re

import xgrammar as xgr

from octavo.sampling_params import StructuredOutputsParams

# xgrammar prefixes its C++ errors with a timestamp and a source location.
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_ANY_OBJECT = '{"type": "object"}'
# The character class xgrammar (0.2.8) gives strings with minLength/maxLength admits raw
# control characters, which JSON forbids (its unbounded strings exclude them).
_LAX_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices`` (JSON string literals are valid
    xgrammar EBNF literals, escapes included)."""
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


def build_grammar(kind: str, spec: str) -> xgr.Grammar:
    """The grammar of a constraint, without a tokenizer: cheap, and it rejects every
    malformed schema, regex or grammar. Raises ``ValueError`` naming the kind and the
    problem."""
    try:
        if kind in ("json", "json_object"):
            return _json_schema_grammar(spec if kind == "json" else _ANY_OBJECT)
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec)))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(spec)
    except RuntimeError as exc:
        raise ValueError(f"structured {kind}: {_clean(exc)}") from None
    raise ValueError(f"unknown kind of structured output {kind!r}")


def _json_schema_grammar(schema: str) -> xgr.Grammar:
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False)
    ebnf = str(grammar)
    if _LAX_STRING_CHAR not in ebnf:
        return grammar
    return xgr.Grammar.from_ebnf(ebnf.replace(_LAX_STRING_CHAR, _JSON_STRING_CHAR))


@functools.lru_cache(maxsize=256)
def _validate(kind: str, spec: str) -> None:
    build_grammar(kind, spec)


def validate(params: StructuredOutputsParams) -> None:
    """Raise ``ValueError`` unless xgrammar accepts the constraint (the front end's check, so
    a bad one never reaches the engine). Cached: a batch with one schema checks it once."""
    _validate(params.kind, params.spec)


def _clean(exc: Exception) -> str:
    return _XGRAMMAR_PREFIX.sub("", str(exc)).strip()
