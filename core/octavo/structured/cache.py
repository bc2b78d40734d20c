"""``GrammarCache``: grammars compiled against the model's tokenizer on worker threads,
kept by constraint so every request with the same schema shares one compilation.

Compiling a JSON schema takes from milliseconds to seconds (xgrammar precomputes which
tokens each grammar state can accept); on a worker thread it never stalls the engine loop,
which only polls the future. The tokenizer's xgrammar description is itself built lazily,
on the first compilation: an engine that never sees a constrained request pays nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import xgrammar as xgr


class GrammarCache:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 max_cached: int = 256, max_workers: int = 2) -> None:
        # Compiled grammars hold token tables of a few MB at most.
        self.max_cached = max_cached
        """``vocab_size`` is the width of the model's logits, which may exceed the
        tokenizer's vocabulary (padded embeddings): xgrammar never allows the extra ids.
        ``stop_token_ids`` are what ends a finished grammar (the model's EOS)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="octavo-grammar")
        self._futures: OrderedDict[tuple[str, str], Future[xgr.CompiledGrammar]] = OrderedDict()

    def get(self, kind: str, spec: str) -> Future[xgr.CompiledGrammar]:
        """The compiled grammar of a constraint, as a future: done at once when cached."""
        key = (kind, spec)
        future = self._futures.get(key)
        if future is None:
            future = self._executor.submit(self._compile, kind, spec)
            self._futures[key] = future
            if len(self._futures) > self.max_cached:
                self._futures.popitem(last=False)
        else:
            self._futures.move_to_end(key)
        return future

    def _compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        from octavo.structured.grammar import build_grammar  # imports xgrammar

        return self.compiler().compile_grammar(build_grammar(kind, spec))

    def compiler(self) -> xgr.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids)
                # xgrammar's own cache would duplicate this class's.
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler
