"""n-gram (prompt lookup) proposer: continue the text the way it went the last time.

For each request, find the longest suffix of its tokens - between ``prompt_lookup_min``
and ``prompt_lookup_max`` long - that occurred earlier in its own tokens (prompt and
output), and propose the up to ``k`` tokens that followed its most recent earlier
occurrence. Copy-heavy work (quoting, editing, extraction, code) repeats long spans of the
prompt, and there this costs nothing yet often guesses several tokens right.

Vectorised with numpy (see ``find_ngram_drafts``): tens of microseconds per request and
step, far below a forward pass (figures in docs/architecture.md, "Speculative decoding").
"""

from __future__ import annotations

import numpy as np

from octavo.plugin_api import ProposeInputs, Proposer


def find_ngram_drafts(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The tokens that followed the most recent earlier occurrence of the longest suffix
    of ``tokens`` of length in ``[min_n, max_n]``; empty when none occurred.

    Candidates are the earlier positions holding the last token (each has a next token);
    their match with the suffix is extended backwards one token at a time, all candidates
    at once, so a step costs one pass over the tokens plus ``max_n`` small gathers.
    """
    num_tokens = len(tokens)
    ends = np.flatnonzero(tokens[: num_tokens - 1] == tokens[num_tokens - 1])
    if len(ends) == 0:
        return tokens[:0]
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, min(max_n, num_tokens - 1)):
        before = ends - back
        alive &= (before >= 0) & (tokens[np.maximum(before, 0)] == tokens[num_tokens - 1 - back])
        lengths += alive
    best = int(lengths.max())
    if best < min_n:
        return tokens[:0]
    end = int(ends[np.flatnonzero(lengths == best)[-1]])
    return tokens[end + 1 : end + 1 + k]


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
