"""The scheduler's speculative-decoding side: how many drafts a request gets verified,
the lookahead room it needs, and the rollback after verification.

Drafts are not tokens: they live in ``Request.spec_token_ids`` until scheduled, never
enter ``output_token_ids`` (so block hashes, and with them the prefix cache, only ever
see accepted tokens), and a step that verifies ``n`` drafts advances
``num_computed_tokens`` by ``1 + n`` up front, like any other scheduled token. When the
verification comes back with ``a`` accepted drafts, the ``n - a`` rejected ones are taken
back off ``num_computed_tokens`` (their KV slots are overwritten later), and blocks that
only they (or unused lookahead) needed go back to the pool.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from octavo.kv.interface import KVCacheManagerInterface
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.request import Request
from octavo.stats import SpecDecodingStats

logger = logging.getLogger(__name__)
LOG_INTERVAL_S = 10.0


class SpecScheduling:
    def __init__(self, num_speculative_tokens: int, max_model_len: int,
                 kv_manager: KVCacheManagerInterface) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        self.kv_manager = kv_manager
        self.stats = SpecDecodingStats()
        self._trimmed: dict[str, int] = {}  # for the workers, see SchedulerOutput
        self._logged = SpecDecodingStats()
        self._last_log = time.monotonic()

    def drafts_to_schedule(self, request: Request, budget_left: int) -> list[int]:
        """The drafts to verify with a decoding request's next token: within the token
        budget, never past max_model_len or max_tokens (each accepted draft plus the bonus
        token is an output token)."""
        drafts, request.spec_token_ids = request.spec_token_ids, []
        if not drafts or request.num_tokens - request.num_computed_tokens != 1:
            return []
        room = min(budget_left, self.max_model_len - request.num_tokens - 1)
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - request.num_output_tokens - 1)
        return drafts[: max(room, 0)]

    def lookahead(self, request: Request, num_new_tokens: int,
                  num_computed: int | None = None) -> int:
        """Slots past the step's tokens for a request that samples this step: a draft
        model or EAGLE head writes its own KV for up to k tokens beyond them."""
        computed = request.num_computed_tokens if num_computed is None else num_computed
        end = computed + num_new_tokens
        if end < request.num_tokens:
            return 0  # mid-prefill: nothing is sampled, nothing is drafted
        return max(0, min(self.num_speculative_tokens, self.max_model_len - end))

    def roll_back(self, request: Request, scheduler_output: SchedulerOutput,
                  token_ids: list[int]) -> None:
        """Before the step's tokens are appended: un-compute the rejected drafts."""
        drafts = scheduler_output.scheduled_spec_decode_tokens.get(request.request_id)
        if not drafts or not token_ids:
            return
        num_accepted = len(token_ids) - 1
        request.num_computed_tokens -= len(drafts) - num_accepted
        # A tree's nodes (more than k) are accepted at most k deep.
        positions = min(len(drafts), self.num_speculative_tokens)
        request.spec_stats.record(len(drafts), num_accepted, positions)
        self.stats.record(len(drafts), num_accepted, positions)
        self._maybe_log()

    def after_update(self, request: Request, runner_output: ModelRunnerOutput,
                     index: int | None) -> None:
        """After the tokens are appended to a request that goes on: release the slots past
        its tokens and keep the proposer's drafts for the next step."""
        kept = self.kv_manager.free_trailing_blocks(request, request.num_tokens)
        if kept is not None:
            self._trimmed[request.request_id] = kept
        proposals = runner_output.spec_token_ids
        request.spec_token_ids = list(proposals[index]) if proposals and index is not None \
            else []

    def _maybe_log(self) -> None:
        """Every LOG_INTERVAL_S at most: the acceptance since the previous log line."""
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        new = self.stats.since(self._logged)
        logger.info("speculative decoding: acceptance rate %.1f%%, mean accepted length %.2f, "
                    "per-position acceptance %s (%d drafts, %d draft tokens)",
                    100 * new.acceptance_rate, new.mean_acceptance_length,
                    " ".join(f"{r:.2f}" for r in new.position_rates()), new.num_drafts,
                    new.num_draft_tokens)
        self._logged, self._last_log = self.snapshot(), now

    def take_trimmed(self) -> dict[str, int]:
        trimmed, self._trimmed = self._trimmed, {}
        return trimmed

    def snapshot(self) -> SpecDecodingStats:
        return dataclasses.replace(self.stats,
                                   accepted_per_position=list(self.stats.accepted_per_position))
