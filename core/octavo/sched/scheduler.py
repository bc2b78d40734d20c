"""``Scheduler``: which requests compute how many tokens each step (vLLM V1 style).

There are no prefill and decode phases. Every request has ``num_tokens`` (prompt plus
output) and ``num_computed_tokens`` (those whose K/V are in the cache); each step grants
requests new tokens within a token budget (``max_num_batched_tokens``) and a cap on
running requests (``max_num_seqs``). A prompt gets chunks of what the budget leaves
(chunked prefill, always on; at most ``long_prefill_token_threshold`` tokens a step when
that is set); a decode gets 1.

Order: running requests first, in policy order; with speculative decoding a decode gets
1 + its drafts (see ``octavo.sched.spec_decode``); when the KV pool cannot hold a running
request's new tokens, the policy's least valued running request that has not been
scheduled this step (nor is in a step in flight) is preempted (its blocks are freed and it
goes back to waiting, to be recomputed later - cheaply, since its full blocks stay in the
prefix cache until evicted). Then, if nothing was preempted, waiting requests in policy
order, each starting after its longest cached prefix.

``num_computed_tokens`` advances when a request is scheduled, not when its output
returns: the tokens of a step are as good as computed once the step is sent, so the
next step can be planned from the scheduler's state alone.

Steps in flight (pipeline micro-batches): the engine core may schedule a step before the
outputs of the ones before it are back. A request is in at most one step in flight: from
``schedule()`` until ``update_from_output()`` of that step it is passed over, and it is
never a preemption victim (that step's forward pass writes its blocks). An abort or a stop
frees a request in flight at once; the workers run their steps in order, so a block freed
that way is written by the step in flight before any later step reuses it, and the
request's tokens from that step are dropped when it returns. With ``steps_in_flight`` = k
a step schedules at most 1/k of the running requests (the first in policy order that are
not in flight), so that the steps in flight share them instead of one holding them all, and
(with chunked prefill) at most 1/k of ``max_num_batched_tokens``, so that a pipeline fills
after a fraction of a step's prefill rather than a whole one.

Async scheduling (``async_scheduling``) is the other way to keep steps in flight: the next
step is planned while the last one runs, and a request may be in both, its unknown
sampled token a placeholder (``octavo.sched.in_flight``). There every running request is
in every step, so a request in flight may be preempted: like an abort, its blocks are
written by its step in flight before any later step reuses them, and that step's token is
dropped when it returns.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.config import EngineConfig
from octavo.kv.block import KVBlock
from octavo.kv.interface import KVCacheManagerInterface
from octavo.kv_transfer.base import KVConnector
from octavo.outputs import (
    CachedRequestData,
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    LogprobsLists,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    SchedulerStats,
)
from octavo.request import Request, RequestStatus
from octavo.sched.in_flight import InFlightRequests, add_placeholders, may_overlap, step_start
from octavo.sched.interface import SchedulerInterface
from octavo.sched.kv_transfer import KVTransferScheduling
from octavo.sched.lora import admissible, requests_per_adapter
from octavo.sched.policy import FcfsPolicy, SchedulingPolicy
from octavo.sched.spec_decode import SpecScheduling
from octavo.sched.stop import check_stop
from octavo.stats import KVTransferStats

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np

    from octavo.sched.structured_outputs import StructuredOutputManager


@dataclass
class _Step:
    """The step being planned."""

    token_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    preempted: bool = False
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)


class Scheduler(SchedulerInterface):
    """The default scheduler. Its parts come built (the engine resolves their names in the
    plugin registries): the KV-cache manager, the waiting-queue policy, the scheduler side
    of a KV connector, the grammars of guided decoding."""

    supports_steps_in_flight = True

    def __init__(self, config: EngineConfig, kv_manager: KVCacheManagerInterface, *,
                 policy: SchedulingPolicy | None = None,
                 kv_connector: KVConnector | None = None,
                 structured_output: StructuredOutputManager | None = None) -> None:
        if config.model.max_model_len is None:
            raise ValueError("the scheduler needs config.model.max_model_len resolved")
        self.config = config
        self.max_model_len: int = config.model.max_model_len
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_num_batched_tokens = config.scheduler.max_num_batched_tokens
        # Most tokens one request computes in a step (0: off), vLLM's
        # long_prefill_token_threshold: a long prompt leaves budget for the others.
        self.long_prefill_token_threshold = config.scheduler.long_prefill_token_threshold
        # Off for pooling models that need a prompt whole in one step (SchedulerConfig).
        self.chunked_prefill = config.scheduler.enable_chunked_prefill
        # Distinct LoRA adapters running at once (0: LoRA off).
        self.max_loras = config.lora.max_loras if config.lora.enable_lora else 0
        self.kv_manager = kv_manager
        self.policy = policy if policy is not None else FcfsPolicy()
        # Grammars of guided decoding; None: the engine takes no constrained requests.
        self.structured_output = structured_output
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: list[Request] = []  # kept in policy order
        self.running: list[Request] = []
        # Finished, aborted or preempted since the last step: the workers drop their state.
        self.finished_req_ids: set[str] = set()
        self.kv_transfer = (KVTransferScheduling(kv_connector, kv_manager)
                            if kv_connector is not None else None)
        k = config.num_speculative_tokens
        self.spec = SpecScheduling(k, self.max_model_len, kv_manager) if k else None
        # Pipeline stages before the last do not sample: they are sent the sampled tokens.
        self.send_new_tokens = config.parallel.pipeline_parallel_size > 1
        # The requests of the steps scheduled whose outputs are not applied yet.
        self.in_flight = InFlightRequests()
        # Plan a step while the last runs, a request in both (octavo.sched.in_flight).
        self.async_scheduling = bool(config.scheduler.async_scheduling)  # settled: never None

    def add_request(self, request: Request) -> None:
        request_id = request.request_id
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the scheduler")
        if not 0 < request.num_prompt_tokens <= self.max_model_len:
            raise ValueError(
                f"request {request_id!r}: the prompt has {request.num_prompt_tokens} tokens; "
                f"it must have between 1 and max_model_len ({self.max_model_len})"
            )
        embeds = request.prompt_embeds
        if embeds is not None and embeds.shape[0] != request.num_prompt_tokens:
            raise ValueError(f"request {request_id!r}: {embeds.shape[0]} prompt embedding rows "
                             f"for {request.num_prompt_tokens} prompt tokens")
        if request.sampling_params.structured_outputs is not None:
            self._add_structured(request)
        request.events.append(EngineCoreEvent.now(EngineCoreEventType.QUEUED))
        self.requests[request_id] = request
        bisect.insort(self.waiting, request, key=self.policy.sort_key)

    def schedule(self) -> SchedulerOutput:
        step = _Step(token_budget=self._step_token_budget())
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        grammar_ids, grammar_bitmask = self._grammar_bitmask(step)
        output = SchedulerOutput(
            scheduled_new_reqs=step.new_reqs,
            scheduled_cached_reqs=step.cached_reqs,
            num_scheduled_tokens=step.num_scheduled_tokens,
            total_num_scheduled_tokens=sum(step.num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            scheduled_spec_decode_tokens=step.spec_tokens,
            trimmed_block_tables=self.spec.take_trimmed() if self.spec else {},
            structured_output_request_ids=grammar_ids,
            grammar_bitmask=grammar_bitmask,
        )
        if self.kv_transfer is not None:
            self.kv_transfer.attach_metadata(output)
        self.finished_req_ids = set()
        if self.async_scheduling:
            add_placeholders(self.requests[request_id] for request_id in step.num_scheduled_tokens)
        if self.steps_in_flight > 1 or self.async_scheduling:  # otherwise none is in flight
            self.in_flight.add(step.num_scheduled_tokens)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append the sampled tokens, finish the requests that stop, report to the front end."""
        self._release(scheduler_output)
        if model_runner_output.kv_connector_output is not None and self.kv_transfer is not None:
            for loaded in self.kv_transfer.update(model_runner_output.kv_connector_output):
                bisect.insort(self.waiting, loaded, key=self.policy.sort_key)
        sampled = dict(zip(model_runner_output.req_ids, model_runner_output.sampled_token_ids))
        index = ({req_id: i for i, req_id in enumerate(model_runner_output.req_ids)}
                 if self.spec else {})
        outputs: list[EngineCoreOutput] = []
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            # A request mid-prefill has nothing to sample yet; ignore whatever came back.
            # (With a placeholder a later step in flight completed the prefill, not
            # necessarily this one: the worker sampled only where this one did.)
            prefill_done = (request.num_output_placeholders > 0
                            or request.num_computed_tokens >= request.num_tokens)
            token_ids = sampled.get(request_id, []) if prefill_done else []
            if self.spec:
                self.spec.roll_back(request, scheduler_output, token_ids)
            new_token_ids = self._append_tokens(request, token_ids)
            request.num_output_placeholders = max(
                request.num_output_placeholders - len(token_ids), 0)
            self._advance_grammar(request, new_token_ids)
            if self.spec and not request.is_finished:
                self.spec.after_update(request, model_runner_output, index.get(request_id))
            logprobs = model_runner_output.logprobs.get(request_id)
            step_prompt_logprobs = model_runner_output.prompt_logprobs.get(request_id)
            prompt_logprobs = (None if step_prompt_logprobs is None else
                               self._unsent_prompt_logprobs(
                                   request, step_prompt_logprobs,
                                   step_start(scheduler_output, request_id)))
            if new_token_ids or request.is_finished or prompt_logprobs is not None:
                outputs.append(EngineCoreOutput(
                    request_id=request_id,
                    new_token_ids=new_token_ids,
                    finish_reason=request.status.value if request.is_finished else None,
                    stop_reason=request.stop_reason,
                    new_logprobs=_first_rows(logprobs, len(new_token_ids)),
                    new_prompt_logprobs=prompt_logprobs,
                    num_cached_tokens=request.num_cached_tokens,
                    events=request.events,
                    spec_decoding=(request.spec_stats if self.spec and request.is_finished
                                   else None),
                ))
                request.events = []
        return outputs

    @staticmethod
    def _unsent_prompt_logprobs(request: Request, logprobs: LogprobsLists | None,
                                first_position: int) -> LogprobsLists | None:
        """The prompt logprobs (rows from ``first_position`` on) of positions not reported
        before: a request preempted after (part of) its prefill computes those positions
        again, and the front end must not get them twice."""
        if logprobs is None:
            return None
        num_rows = len(logprobs.ranks)
        seen = min(max(request.num_prompt_logprobs_sent - first_position, 0), num_rows)
        request.num_prompt_logprobs_sent = max(request.num_prompt_logprobs_sent,
                                               first_position + num_rows)
        if seen == num_rows:
            return None
        return LogprobsLists(logprobs.token_ids[seen:], logprobs.logprobs[seen:],
                             logprobs.ranks[seen:])

    def forget_steps(self, scheduler_outputs: list[SchedulerOutput]) -> None:
        for scheduler_output in scheduler_outputs:
            self._release(scheduler_output)

    def _release(self, scheduler_output: SchedulerOutput) -> None:
        """A step's output came (or never will): its requests may be scheduled again. Every
        ``update_from_output`` (a subclass's too) calls this first."""
        self.in_flight.release(scheduler_output.num_scheduled_tokens)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """End requests from outside (abort, or a stop string the front end found). Unknown
        or already finished ids are ignored: the request may have finished meanwhile."""
        if not status.finished:
            raise ValueError(f"finish_requests needs a finished status, got {status}")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.kv_transfer and self.kv_transfer.sending)

    def reset_prefix_cache(self) -> None:
        self.kv_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_manager.usage,
            prefix_cache=dataclasses.replace(self.kv_manager.prefix_stats),
            kv_transfer=(dataclasses.replace(self.kv_transfer.stats) if self.kv_transfer
                         else KVTransferStats()),
            spec_decoding=self.spec.snapshot() if self.spec else None,
            running_lora_adapters=requests_per_adapter(self.running),
            waiting_lora_adapters=requests_per_adapter(self.waiting),
        )

    def _step_token_budget(self) -> int:
        """A step's token budget. With micro-batches (``steps_in_flight`` = k) and chunked
        prefill each step takes 1/k of ``max_num_batched_tokens``, so that the steps in flight
        hold one budget between them: a pipeline that starts empty (a burst of prompts) waits
        in its later stages while the first computes the first step, and with a whole budget
        of prefill in that step the wait was 1.2-3.1 s of W1's 17-29 s at PP=2 (the fill
        bubble; docs/parallel.md). Without chunking a prompt must fit one step whole, so the
        budget stays whole."""
        if self.steps_in_flight == 1 or not self.chunked_prefill:
            return self.max_num_batched_tokens
        return max(1, self.max_num_batched_tokens // self.steps_in_flight)

    def _schedule_running(self, step: _Step) -> None:
        # With steps in flight each takes its share of the running requests: otherwise one
        # step would hold them all and the next none, one step at a time after all.
        share = -(-len(self.running) // self.steps_in_flight)
        for request in self.policy.order(self.running):
            if step.token_budget == 0 or len(step.num_scheduled_tokens) >= share:
                break
            if request.status is not RequestStatus.RUNNING or not self._schedulable(request):
                continue  # preempted earlier in this loop, or its last step is not back
            num_new_tokens = min(self._capped(request.num_tokens + request.num_output_placeholders
                                              - request.num_computed_tokens), step.token_budget)
            drafts = (self.spec.drafts_to_schedule(request, step.token_budget - num_new_tokens)
                      if self.spec else [])
            num_new_tokens += len(drafts)
            new_blocks = self._allocate_or_preempt(request, num_new_tokens, step)
            if new_blocks is None:
                break  # it preempted itself: no request after it in policy order fits either
            if drafts:
                step.spec_tokens[request.request_id] = drafts
            cached = step.cached_reqs
            cached.req_ids.append(request.request_id)
            if self.kv_manager.num_kv_groups == 1:
                cached.new_block_ids.append([block.block_id for block in new_blocks])
            else:
                by_group = self.kv_manager.group_new_block_ids(new_blocks)
                cached.new_block_ids.append(by_group[0])
                cached.new_group_block_ids.append(by_group)
            cached.num_computed_tokens.append(request.num_computed_tokens)
            cached.new_token_ids.append(self._sampled_tokens_in(request, num_new_tokens)
                                        if self.send_new_tokens else [])
            self._grant(request, num_new_tokens, step)

    def _schedulable(self, request: Request) -> bool:
        """Not in a step in flight - or, with async scheduling, allowed in the next one."""
        return (request.request_id not in self.in_flight
                or (self.async_scheduling
                    and may_overlap(request, self.max_model_len, drafts=self.spec is not None)))

    @staticmethod
    def _sampled_tokens_in(request: Request, num_new_tokens: int) -> list[int]:
        """The output tokens among the positions this step computes (the last sampled)."""
        start = max(request.num_computed_tokens, request.num_prompt_tokens)
        return request.output_token_ids[start - request.num_prompt_tokens:
                                        request.num_computed_tokens + num_new_tokens
                                        - request.num_prompt_tokens]

    def _allocate_or_preempt(
        self, request: Request, num_new_tokens: int, step: _Step
    ) -> list[KVBlock] | None:
        """Allocate, preempting the policy's victim until it fits; ``None`` once the victim
        is ``request`` itself. Only requests not yet scheduled this step can be victims:
        their blocks are not about to be written by this step's forward pass."""
        lookahead = self.spec.lookahead(request, num_new_tokens) if self.spec else 0
        while True:
            new_blocks = self.kv_manager.allocate_slots(request, num_new_tokens,
                                                        num_lookahead_tokens=lookahead)
            if new_blocks is not None:
                return new_blocks
            candidates = [r for r in self.running
                          if r.request_id not in step.num_scheduled_tokens
                          and (self.async_scheduling or r.request_id not in self.in_flight)]
            victim = self.policy.pick_victim(candidates)
            self._preempt(victim)
            step.preempted = True
            if victim is request:
                return None

    def _schedule_waiting(self, step: _Step) -> None:
        while (self.waiting and step.token_budget > 0
               and len(self.running) < self.max_num_seqs):
            request = self._next_waiting()
            if request is None:
                break  # every waiting request waits for its grammar
            transfer = self.kv_transfer
            hit_blocks: list[KVBlock]
            if transfer is not None and transfer.back_from_load(request):
                hit_blocks, num_hit_tokens = [], request.num_computed_tokens
            else:
                hit_blocks, num_hit_tokens = self.kv_manager.get_computed_blocks(request)
                if transfer is not None and request.status is RequestStatus.WAITING:
                    started = transfer.start_load(request, hit_blocks, num_hit_tokens)
                    if started is None:
                        break  # no room for it; keep policy order
                    if started:
                        self.waiting.remove(request)
                        continue
            num_new_tokens = self._chunk(request.num_tokens - num_hit_tokens,
                                         step.token_budget)
            if not num_new_tokens:
                break  # its whole prompt does not fit this step; keep policy order
            lookahead = (self.spec.lookahead(request, num_new_tokens, num_hit_tokens)
                         if self.spec else 0)
            if self.kv_manager.allocate_slots(request, num_new_tokens, hit_blocks,
                                              num_lookahead_tokens=lookahead) is None:
                break  # keep policy order: nothing behind it jumps the queue
            self.waiting.remove(request)
            if request.status is RequestStatus.WAITING:  # not a preempted one coming back
                request.num_cached_tokens = num_hit_tokens
            request.num_computed_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            request.events.append(EngineCoreEvent.now(EngineCoreEventType.SCHEDULED))
            self.running.append(request)
            step.new_reqs.append(NewRequestData(
                req_id=request.request_id,
                prompt_token_ids=list(request.prompt_token_ids),
                sampling_params=request.sampling_params,
                block_ids=self.kv_manager.get_block_ids(request.request_id),
                num_computed_tokens=num_hit_tokens,
                output_token_ids=list(request.output_token_ids),
                prompt_embeds=request.prompt_embeds,
                group_block_ids=(self.kv_manager.get_group_block_ids(request.request_id)
                                 if self.kv_manager.num_kv_groups > 1 else []),
                state_slot=self.kv_manager.get_state_slot(request.request_id),
                lora=request.lora,
            ))
            self._grant(request, num_new_tokens, step)

    def _chunk(self, num_new_tokens: int, token_budget: int) -> int:
        """How many of a waiting request's ``num_new_tokens`` it computes this step: a chunk
        within the budget, or - without chunked prefill - all of them, or 0 when they do
        not fit the budget that is left."""
        if not self.chunked_prefill:
            return num_new_tokens if num_new_tokens <= token_budget else 0
        return min(self._capped(num_new_tokens), token_budget)

    def _capped(self, num_new_tokens: int) -> int:
        """A chunk no longer than ``long_prefill_token_threshold`` (when it is on)."""
        threshold = self.long_prefill_token_threshold
        return min(num_new_tokens, threshold) if threshold > 0 else num_new_tokens

    @staticmethod
    def _grant(request: Request, num_new_tokens: int, step: _Step) -> None:
        step.num_scheduled_tokens[request.request_id] = num_new_tokens
        step.token_budget -= num_new_tokens
        request.num_computed_tokens += num_new_tokens

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks and send it back to waiting, to be recomputed."""
        self.kv_manager.free(request)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0  # its steps in flight are dropped
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.events.append(EngineCoreEvent.now(EngineCoreEventType.PREEMPTED))
        bisect.insort(self.waiting, request, key=self.policy.sort_key)
        self.finished_req_ids.add(request.request_id)

    def _append_tokens(self, request: Request, token_ids: list[int]) -> list[int]:
        """Append sampled tokens one by one until one of them stops the request."""
        appended: list[int] = []
        for token_id in token_ids:
            request.output_token_ids.append(token_id)
            appended.append(token_id)
            if request.num_output_tokens == 1:
                request.events.append(EngineCoreEvent.now(EngineCoreEventType.FIRST_TOKEN))
            stop = check_stop(request, self.max_model_len)
            if stop is not None:
                status, request.stop_reason = stop
                self._finish(request, status)
                break
        return appended

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
            assert self.kv_transfer is not None
            del self.kv_transfer.loading[request.request_id]
        else:
            queue = self.running if request.status is RequestStatus.RUNNING else self.waiting
            queue.remove(request)
        request.status = status
        self._free_finished(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        if self.structured_output is not None:
            self.structured_output.remove_request(request.request_id)

    # -- guided decoding ----------------------------------------------------------------
    def _add_structured(self, request: Request) -> None:
        """Start compiling the request's grammar; it waits until the grammar is ready."""
        if self.structured_output is None:
            raise ValueError(f"request {request.request_id!r} asks for structured outputs, "
                             "which this scheduler was built without")
        params = request.sampling_params.structured_outputs
        assert params is not None
        self.structured_output.add_request(request.request_id, params)
        request.status = RequestStatus.WAITING_FOR_GRAMMAR

    def _next_waiting(self) -> Request | None:
        """The first waiting request in policy order that can start: those whose grammar
        is still compiling are passed over, so they hold up nobody; so are those whose id
        is in a step in flight (a request aborted there and added again under its id) and
        those whose LoRA adapter has no slot yet (``octavo.sched.lora``)."""
        waiting = (admissible(self.waiting, self.running, self.max_loras)
                   if self.max_loras else self.waiting)
        for request in waiting:
            if request.request_id in self.in_flight:
                continue
            if request.status is not RequestStatus.WAITING_FOR_GRAMMAR:
                return request
            assert self.structured_output is not None
            if self.structured_output.grammar_ready(request.request_id):
                request.status = RequestStatus.WAITING
                return request
        return None

    def _grammar_bitmask(self, step: _Step) -> tuple[list[str], np.ndarray | None]:
        if self.structured_output is None:
            return [], None
        return self.structured_output.grammar_bitmask(
            self.requests[request_id] for request_id in step.num_scheduled_tokens)

    def _advance_grammar(self, request: Request, new_token_ids: list[int]) -> None:
        """Feed the new tokens to the request's grammar. A complete grammar finishes the
        request; a token it rejects aborts it (possible only when the grammar failed to
        compile, or other settings, e.g. min_tokens, left the bitmask no token to allow)."""
        if self.structured_output is None or not new_token_ids:
            return
        request_id = request.request_id
        if not self.structured_output.accept_tokens(request_id, new_token_ids):
            if not request.is_finished:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
        elif self.structured_output.is_terminated(request_id) and not request.is_finished:
            self._finish(request, RequestStatus.FINISHED_STOPPED)

    def _free_finished(self, request: Request) -> None:
        """Free a finished request's blocks - unless the connector is still saving its KV
        from them; then once the worker reports the save done."""
        if self.kv_transfer is not None and self.kv_transfer.keeps_blocks(request):
            return
        self.kv_manager.free(request)


def _first_rows(logprobs: LogprobsLists | None, num_rows: int) -> LogprobsLists | None:
    """The logprobs of the tokens kept (a stop may discard later sampled tokens)."""
    if logprobs is None or num_rows == 0:
        return None
    if len(logprobs.ranks) == num_rows:
        return logprobs
    return LogprobsLists(logprobs.token_ids[:num_rows], logprobs.logprobs[:num_rows],
                         logprobs.ranks[:num_rows])
