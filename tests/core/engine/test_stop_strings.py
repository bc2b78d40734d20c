"""``StopStrings`` (the Aho–Corasick stop-string matcher) against a naive search, on random
text fed in random pieces, and through the detokenizer."""

from __future__ import annotations

import random

import pytest

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.stop_strings import ROOT, StopHit, StopStrings
from octavo.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import tiny_tokenizer

ALPHABET = "abc "  # few letters: stop strings overlap, share prefixes and suffixes, and occur
ROUNDS = 400


def naive_first_stop(text: str, stops: list[str]) -> StopHit | None:
    """The stop string that ends first in ``text``; of those ending together, the longest."""
    for end in range(1, len(text) + 1):
        ending = [stop for stop in stops if stop and text.endswith(stop, 0, end)]
        if ending:
            return StopHit(end, max(ending, key=len))
    return None


def scan_in_pieces(stops: StopStrings, text: str, rng: random.Random) -> StopHit | None:
    """Feed ``text`` in random pieces, as tokens' text arrives; the hit, at its offset in
    the whole text."""
    state, fed = ROOT, 0
    while fed < len(text):
        piece = text[fed:fed + rng.randint(1, 6)]
        state, hit = stops.scan(state, piece)
        if hit is not None:
            return StopHit(fed + hit.end, hit.stop)
        fed += len(piece)
    return None


def random_text(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(low, high)))


def test_the_automaton_finds_what_a_naive_search_finds() -> None:
    seed = draw_seed()
    rng = random.Random(seed)
    hits = 0
    for _ in range(ROUNDS):
        stops = [random_text(rng, 0, 5) for _ in range(rng.randint(0, 12))]
        text = random_text(rng, 0, 60)
        expected = naive_first_stop(text, stops)
        assert scan_in_pieces(StopStrings(stops), text, rng) == expected, (seed, stops, text)
        hits += expected is not None
    assert ROUNDS // 4 < hits < ROUNDS, hits  # both outcomes were tried, often


@pytest.mark.parametrize("include", [False, True])
def test_the_detokenizer_cuts_the_text_where_the_naive_search_does(include: bool) -> None:
    """One token per character (the byte-level tiny tokenizer on ASCII)."""
    seed = draw_seed()
    rng = random.Random(seed)
    tokenizer = tiny_tokenizer()
    for _ in range(ROUNDS // 4):
        stops = [random_text(rng, 1, 4) for _ in range(rng.randint(1, 8))]
        text = random_text(rng, 1, 40)
        params = SamplingParams(stop=stops, include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tokenizer, [], params)
        found = None
        for token_id in tokenizer.encode(text, add_special_tokens=False):
            found = detok.check_stop_strings(len(detok.add_token(token_id)))
            if found is not None:
                break
        expected = naive_first_stop(text, stops)
        if expected is None:
            assert (found, detok.output_text) == (None, text), (seed, stops, text)
        else:
            end = expected.end if include else expected.end - len(expected.stop)
            assert (found, detok.output_text) == (expected.stop, text[:end]), (seed, stops, text)


@pytest.mark.parametrize(("stop", "message"), [
    (["x"] * (MAX_STOP_STRINGS + 1), f"at most {MAX_STOP_STRINGS}"),
    (["y" * (MAX_STOP_CHARS // 2 + 1)] * 2, f"at most {MAX_STOP_CHARS}"),
])
def test_too_many_stop_strings_are_refused(stop: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(stop=stop)
    SamplingParams(stop=stop[:MAX_STOP_STRINGS] if len(stop) > 2 else stop[:1])
