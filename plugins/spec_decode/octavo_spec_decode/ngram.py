"""n-gram (prompt lookup) proposer: continue the text the way it went the last time.

For each request, find the longest suffix of its tokens - between ``prompt_lookup_min``
and ``prompt_lookup_max`` long - that occurred earlier in its own tokens (prompt and
output), and propose the up to ``k`` tokens that followed its most recent earlier
occurrence. Copy-heavy work (quoting, editing, extraction, code) repeats long spans of the
prompt, and there this costs nothing yet often guesses several tokens right.

Vectorised with numpy: per request and suffix length one ``sliding_window_view``
comparison over its tokens, so a step costs microseconds per request - far below a
forward pass (see ``octavo bench spec`` / docs).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from octavo.spec.proposer import ProposeInputs, Proposer


def find_ngram_drafts(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The tokens that followed the most recent earlier occurrence of the longest suffix
    of ``tokens`` of length in ``[min_n, max_n]``; empty when none occurred."""
    num_tokens = len(tokens)
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        # Windows starting before the suffix itself: each has a following token.
        windows = sliding_window_view(tokens[: num_tokens - 1], n)
        hits = np.flatnonzero((windows == tokens[num_tokens - n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + k]
    return tokens[:0]


class NgramProposer(Proposer):
    name = "ngram"

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        config = self.config
        drafts: list[list[int]] = []
        for i, row in enumerate(inputs.rows.tolist()):
            if not inputs.wants_drafts[i]:
                drafts.append([])
                continue
            tokens = inputs.token_ids[row, : int(inputs.num_tokens[i])]
            drafts.append(find_ngram_drafts(tokens, config.prompt_lookup_min,
                                            config.prompt_lookup_max,
                                            self.num_speculative_tokens).tolist())
        return drafts
