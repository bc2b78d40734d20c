"""Incremental detokenization and stop strings (``octavo.engine.detokenizer``)."""

from __future__ import annotations

import pytest

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.models.loader import load_model_files
from octavo.sampling_params import SamplingParams
from tests.core.tiny_models import tiny_tokenizer

TEXTS = [
    "plain ascii, with spaces  and\nnewlines",
    "héllo wörld — ça va? 世界 你好",
    "emoji 😀👍🏽 and flags 🇫🇷 mixed in",
    "def f(x):\n    return {'k': [1, 2]}  # code",
]


@pytest.fixture(scope="module")
def smollm2_tokenizer():  # type: ignore[no-untyped-def]
    return load_model_files(None).tokenizer


def stream(tokenizer, ids: list[int], params: SamplingParams) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    detok = IncrementalDetokenizer(tokenizer, [], params)
    deltas = [detok.add_token(t) for t in ids]
    return detok.output_text, deltas


@pytest.mark.parametrize("which", ["byte-level", "smollm2"])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_full_decode(which: str, text: str, smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tokenizer = tiny_tokenizer() if which == "byte-level" else smollm2_tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    out, deltas = stream(tokenizer, ids, SamplingParams())
    assert out == tokenizer.decode(ids) == text
    # No delta ever carries half a character.
    assert all("\ufffd" not in d for d in deltas)
    if which == "byte-level" and not text.isascii():  # multi-byte characters are held back
        assert "" in deltas


def test_prompt_context_keeps_leading_space(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2_tokenizer
    prompt = tok.encode("The capital of France is")
    completion = tok.encode("The capital of France is Paris, a city")[len(prompt):]
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams())
    for t in completion:
        detok.add_token(t)
    assert detok.output_text == " Paris, a city"


@pytest.mark.parametrize(("include", "expected"), [(False, "abc "), (True, "abc STOP")])
def test_stop_string_spanning_tokens(include: bool, expected: str) -> None:
    tokenizer = tiny_tokenizer()  # one token per byte: "STOP" spans four tokens
    params = SamplingParams(stop=["STOP", "never"], include_stop_str_in_output=include)
    detok = IncrementalDetokenizer(tokenizer, [], params)
    found = None
    for t in tokenizer.encode("abc STOP and more", add_special_tokens=False):
        delta = detok.add_token(t)
        found = detok.check_stop_strings(len(delta))
        if found:
            break
    assert found == "STOP" and detok.output_text == expected


def test_streaming_holds_back_a_possible_stop_prefix() -> None:
    tokenizer = tiny_tokenizer()
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["END"]))
    for t in tokenizer.encode("xyzEN", add_special_tokens=False):
        detok.add_token(t)
    assert detok.output_text == "xyzEN"
    assert detok.streamable_text_len(finished=False) == 3  # "EN" may become "END"
    assert detok.streamable_text_len(finished=True) == 5
