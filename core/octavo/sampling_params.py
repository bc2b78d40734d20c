"""``SamplingParams``: how to sample one request's tokens, and ``StructuredOutputsParams``:
the constraint its output must satisfy. Field names follow vLLM's (which keeps both in
``vllm/sampling_params.py``) so a vLLM user's script works unchanged.

Plain data with no torch or xgrammar import, so it travels inside requests (msgspec) to the
engine core; checking that a schema, regex or grammar is well-formed is
``octavo.structured.grammar``'s job, in the front end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
# Integers the engine's arrays hold (int64): every integer field must fit.
INT64_MAX = 2**63 - 1
# Stop strings per request, and their characters together: what the front end's matcher
# (an automaton of about one state per character) holds per request. 600,000 of them once
# stalled the server; vLLM sets no limit.
MAX_STOP_STRINGS = 1024
MAX_STOP_CHARS = 32 * 1024


def check_text(name: str, text: str) -> None:
    """Text must be encodable as UTF-8 (a lone surrogate is not) to reach the engine."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode text: {exc.reason} at position "
                         f"{exc.start}") from None


def check_int(name: str, value: int | None, low: int = -INT64_MAX - 1,
              high: int = INT64_MAX) -> None:
    if value is not None and not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema, as a dict or its JSON text
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # EBNF (xgrammar's dialect, GBNF-like), start rule ``root``
    # xgrammar's structural tag (a dict or its JSON text): free text with constrained parts,
    # e.g. tool calls whose arguments follow their schema once the model opens one.
    structural_tag: str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        chosen = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError("structured outputs need exactly one of "
                             f"{', '.join(KINDS)}; got {', '.join(chosen) or 'none'}")
        if self.json_object is not True and self.json_object is not False:
            raise ValueError(f"structured json_object must be a bool, got {self.json_object!r}")
        if isinstance(self.json, str):
            self.json = _parse_schema_text(self.json)
        if isinstance(self.structural_tag, str):
            self.structural_tag = _parse_schema_text(self.structural_tag, "structural_tag")
        if self.structural_tag is not None and not isinstance(self.structural_tag, dict):
            raise ValueError("structured structural_tag must be a JSON object (a dict or its "
                             f"JSON text), got {type(self.structural_tag).__name__}")
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"structured json must be a JSON schema object (a dict or its "
                             f"JSON text), got {type(self.json).__name__}")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured choice must be a non-empty list of non-empty "
                                 f"strings, got {self.choice!r}")
            for choice in self.choice:
                check_text("a structured choice", choice)
        for kind in ("regex", "grammar"):
            value = getattr(self, kind)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured {kind} must be a non-empty string, got {value!r}")

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as one canonical string: with ``kind``, the grammar cache's key."""
        value = getattr(self, self.kind)
        if self.kind in ("json", "structural_tag"):
            return json.dumps(value, separators=(",", ":"))  # key order matters: it is the output's
        if self.kind == "choice":
            return json.dumps(value)
        return "" if self.kind == "json_object" else str(value)


def _parse_schema_text(text: str, kind: str = "json") -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"structured {kind} is not valid JSON: {exc}") from None
    except RecursionError:  # the client's text, nested deeper than any schema needs
        raise ValueError(f"structured {kind} is nested too deeply") from None


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


_GREEDY_EPS = 1e-5


class Encoder(Protocol):
    """What ``update_from_tokenizer`` needs of a tokenizer (HF transformers' signature)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    # Keep only the last k prompt tokens (-1: the last max_model_len - 1); None: all.
    truncate_prompt_tokens: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # Guided decoding: the output must match this JSON schema, regex, choice or grammar.
    structured_outputs: StructuredOutputsParams | None = None
    # Filled from ``bad_words`` by ``update_from_tokenizer`` (the engine's Processor does it);
    # the sampler bans these token sequences. Private as in vLLM: users set ``bad_words``.
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range (the front end calls it
        again once it has filled in the defaults)."""
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (-2.0 <= self.presence_penalty <= 2.0,
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.repetition_penalty > 0.0,
             f"repetition_penalty must be greater than 0, got {self.repetition_penalty}"),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be -1 (disable), 0 or at least 1, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.max_tokens is None or self.max_tokens >= 1,
             f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (self.logprobs is None or self.logprobs >= 0,
             f"logprobs must be non-negative, got {self.logprobs}"),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0,
             f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
             "allowed_token_ids must not be empty"),
            (self.truncate_prompt_tokens is None or self.truncate_prompt_tokens == -1
             or self.truncate_prompt_tokens >= 1,
             f"truncate_prompt_tokens must be -1 or at least 1, got "
             f"{self.truncate_prompt_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self._check_engine_limits()

    def _check_engine_limits(self) -> None:
        """Values the engine's arrays and encodings can hold: int64 integers (a seed leaves
        room for ``n`` children's ``seed + i``), finite floats, UTF-8 stop strings."""
        for name in ("top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
                     "truncate_prompt_tokens"):
            check_int(name, getattr(self, name), low=-1)
        check_int("n", self.n, low=1, high=2**31 - 1)
        check_int("seed", self.seed, high=INT64_MAX - self.n)
        for token_id in [*self.stop_token_ids, *(self.allowed_token_ids or []),
                         *(self.logit_bias or {})]:
            check_int("a token id", token_id)
        if any(not math.isfinite(bias) for bias in (self.logit_bias or {}).values()):
            raise ValueError("logit_bias values must be finite numbers")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):  # the kernels' inputs: no inf or NaN
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop holds {len(self.stop)} strings; at most "
                             f"{MAX_STOP_STRINGS} are allowed")
        stop_chars = sum(len(text) for text in self.stop)
        if stop_chars > MAX_STOP_CHARS:
            raise ValueError(f"stop strings hold {stop_chars} characters together; at most "
                             f"{MAX_STOP_CHARS} are allowed")
        for text in [*self.stop, *self.bad_words]:
            check_text("a stop string or bad word", text)

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _GREEDY_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def structured(self) -> StructuredOutputsParams | None:
        """The output constraint, if any (``structured_outputs``, vLLM's field name)."""
        return self.structured_outputs

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        return self._bad_words_token_ids or []

    def update_from_tokenizer(self, tokenizer: Encoder) -> None:
        """Tokenize ``bad_words`` into ``bad_words_token_ids``, as vLLM does.

        A word is banned both at the start of the text and after a space: BPE tokenizers
        encode " word" with different tokens than "word", so both spellings are kept when
        the spaced one is a distinct sequence of the same length.
        """
        sequences: list[list[int]] = []
        for word in self.bad_words:
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if not plain:
                raise ValueError(f"bad_words entry {word!r} encodes to no tokens")
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            sequences.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                sequences.append(spaced)
        self._bad_words_token_ids = sequences
