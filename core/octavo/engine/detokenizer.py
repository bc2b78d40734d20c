"""Incremental detokenization and stop strings for one sequence.

Decoding token by token is wrong for byte-level and byte-fallback tokenizers: one
character may span several tokens, and a token's leading space depends on what precedes
it. So each step decodes a short window of ids twice - the already-emitted part and the
window with the new token - and emits the difference, holding back while the text ends in
an incomplete character (U+FFFD). Stop strings are found by feeding each new piece of text
to the request's ``StopStrings`` automaton, at a cost that does not grow with their number.
"""

from __future__ import annotations

from typing import Any

from octavo.engine.stop_strings import ROOT, StopStrings
from octavo.sampling_params import SamplingParams

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded with the first output, for its spacing


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams,
                 stops: StopStrings | None = None) -> None:
        """``stops``: the automaton of ``params.stop``, built once for all of a request's
        sequences (built here when not given)."""
        self.tokenizer = tokenizer
        self.params = params
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.output_text = ""
        self.stops = StopStrings(params.stop) if stops is None else stops
        self._max_stop_len = self.stops.max_len
        self._stop_state = ROOT

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.params.skip_special_tokens,
            spaces_between_special_tokens=self.params.spaces_between_special_tokens)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text it completes (may be empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        delta = full[len(prefix) :]
        self.output_text += delta
        return delta

    def check_stop_strings(self, new_chars: int) -> str | None:
        """After ``new_chars`` were appended: the stop string now present, truncating the
        text at it (keeping it with ``include_stop_str_in_output``), or None."""
        if not self.stops or not new_chars:
            return None
        start = len(self.output_text) - new_chars
        self._stop_state, hit = self.stops.scan(self._stop_state,
                                                self.output_text[start:])
        if hit is None:
            return None
        end = start + hit.end
        self.output_text = self.output_text[:end if self.params.include_stop_str_in_output
                                            else end - len(hit.stop)]
        return hit.stop

    def streamable_text_len(self, finished: bool) -> int:
        """How much of the text is safe to stream: all when finished, else all but the last
        ``max_stop_len - 1`` characters, which a later token could turn into a stop string."""
        if finished or not self._max_stop_len:
            return len(self.output_text)
        return max(0, len(self.output_text) - self._max_stop_len + 1)
