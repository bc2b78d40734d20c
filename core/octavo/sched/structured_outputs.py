"""``StructuredOutputManager``: the scheduler's side of guided decoding (vLLM V1's design).

For every constrained request it holds the grammar (compiling on a worker thread until the
request may start) and then a matcher: the grammar's state after the tokens generated so
far. Each step it fills one bitmask of allowed tokens for the constrained requests that
sample, which travels to the workers in the ``SchedulerOutput``; after the step the matcher
accepts the sampled tokens. The workers never see a grammar, only bits.

xgrammar (about a second to import) is imported with the first constrained request, not
at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from octavo.config import StructuredOutputsConfig
from octavo.request import Request
from octavo.sampling_params import StructuredOutputsParams
from octavo.structured.cache import GrammarCache

if TYPE_CHECKING:
    import xgrammar as xgr

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 config: StructuredOutputsConfig | None = None) -> None:
        config = config or StructuredOutputsConfig()
        self.cache = GrammarCache(tokenizer, vocab_size, stop_token_ids,
                                  max_cached=config.max_cached_grammars,
                                  max_workers=config.compile_threads)
        self.num_words = -(-vocab_size // 32)  # one bit per token id, 32 to an int32
        self._compiling: dict[str, Future[xgr.CompiledGrammar]] = {}
        self._matchers: dict[str, xgr.GrammarMatcher] = {}
        self._failed: set[str] = set()  # grammar failed to compile: the request is aborted
        self._batch: xgr.BatchGrammarMatcher | None = None  # made with the first matcher

    def add_request(self, request_id: str, params: StructuredOutputsParams) -> None:
        """Start compiling (or find cached) the request's grammar."""
        self._compiling[request_id] = self.cache.get(params.kind, params.spec)

    def grammar_ready(self, request_id: str) -> bool:
        """Whether the request can be scheduled: its grammar compiled (or failed to: then
        ``accept_tokens`` refuses its first token and the scheduler aborts it)."""
        future = self._compiling.get(request_id)
        if future is None:
            return True
        if not future.done():
            return False
        del self._compiling[request_id]
        import xgrammar as xgr

        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher()
        try:
            self._matchers[request_id] = xgr.GrammarMatcher(future.result())
        except Exception:
            logger.exception("request %s: its grammar failed to compile", request_id)
            self._failed.add(request_id)
        return True

    def grammar_bitmask(self, requests: Iterable[Request]) -> tuple[list[str], np.ndarray | None]:
        """The allowed tokens of the constrained ``requests`` that sample a token this step
        (their prompt is fully computed once the step runs): their ids, and int32
        ``[len(ids), ceil(V / 32)]`` with bit ``t % 32`` of word ``t // 32`` set when token
        ``t`` is allowed. ``None`` when no scheduled request is constrained."""
        ids = [r.request_id for r in requests
               if r.request_id in self._matchers and r.num_computed_tokens >= r.num_tokens]
        if not ids:
            return [], None
        bitmask = np.empty((len(ids), self.num_words), dtype=np.int32)
        assert self._batch is not None  # made with the first matcher
        self._batch.batch_fill_next_token_bitmask([self._matchers[i] for i in ids], bitmask)
        return ids, bitmask

    def accept_tokens(self, request_id: str, token_ids: list[int]) -> bool:
        """Advance the request's matcher; False when the grammar rejects a token (or never
        compiled). Requests without a grammar accept anything."""
        if request_id in self._failed:
            return False
        matcher = self._matchers.get(request_id)
        return matcher is None or all(matcher.accept_token(t) for t in token_ids)

    def is_terminated(self, request_id: str) -> bool:
        """Whether the request's grammar is complete and its stop token accepted."""
        matcher = self._matchers.get(request_id)
        return matcher is not None and matcher.is_terminated()

    def remove_request(self, request_id: str) -> None:
        self._compiling.pop(request_id, None)
        self._matchers.pop(request_id, None)
        self._failed.discard(request_id)
