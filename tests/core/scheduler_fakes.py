"""A fake model runner for scheduler tests, and a loop that drives scheduler + runner.

``FakeRunner`` keeps per-request state the way a real worker does (tokens, block table,
computed count) from ``SchedulerOutput`` alone, and simulates the paged KV cache: each
scheduled token writes a fingerprint of its whole context (what real K/V depend on) into
its slot, then every scheduled request reads back *all* its context slots and checks
them. So a wrong block table, a prefix hit on the wrong blocks, a block freed while in
use or a lost token after preemption fails loudly. The sampled token is a deterministic
function of the context, so runs with different pool sizes must produce equal outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from octavo.config import EngineConfig, KVTransferConfig
from octavo.engine.components import build_scheduler
from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.plugins import get_registries
from octavo.request import Request
from octavo.sampling_params import SamplingParams
from octavo.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from octavo.sched.structured_outputs import StructuredOutputManager

VOCAB = 1000


def make_scheduler(num_blocks: int, max_model_len: int, *,
                   kv_transfer: KVTransferConfig | None = None,
                   structured_output: StructuredOutputManager | None = None,
                   **engine_kwargs: Any) -> Scheduler:
    """A scheduler built as the engine builds one (its names resolved in the registries),
    over a KV cache of ``num_blocks`` blocks; ``engine_kwargs`` are ``LLM(...)`` keywords
    (``block_size``, ``max_num_seqs``, ``scheduling_policy``, ...)."""
    config = EngineConfig.from_kwargs(max_model_len=max_model_len, **engine_kwargs)
    config.kv_transfer = kv_transfer
    config.cache.num_gpu_blocks = num_blocks
    scheduler = build_scheduler(config, get_registries(), structured_output)
    assert isinstance(scheduler, Scheduler)
    return scheduler
_MOD = (1 << 61) - 1


def extend_fingerprint(previous: int, token_id: int) -> int:
    return (previous * 1_000_003 + token_id + 1) % _MOD


def default_next_token(request_id: str, num_outputs: int, fingerprint: int) -> int:
    return fingerprint % VOCAB


@dataclass
class _RunnerRequest:
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    fingerprints: list[int] = field(default_factory=list)  # of token_ids[:i + 1]
    num_outputs: int = 0

    def __post_init__(self) -> None:
        for token_id in self.token_ids:
            self.append_fingerprint(token_id)

    def append_fingerprint(self, token_id: int) -> None:
        previous = self.fingerprints[-1] if self.fingerprints else 0
        self.fingerprints.append(extend_fingerprint(previous, token_id))


class FakeRunner:
    def __init__(self, block_size: int,
                 next_token: Callable[[str, int, int], int] = default_next_token) -> None:
        self.block_size = block_size
        self.next_token = next_token
        self.slots: dict[int, int] = {}
        self.reqs: dict[str, _RunnerRequest] = {}

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in so.finished_req_ids:
            self.reqs.pop(request_id, None)
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.reqs, f"{new.req_id} sent as new twice"
            self.reqs[new.req_id] = _RunnerRequest(
                new.prompt_token_ids + new.output_token_ids, list(new.block_ids),
                new.num_computed_tokens, num_outputs=len(new.output_token_ids))
        cached = so.scheduled_cached_reqs
        for request_id, new_block_ids, num_computed in zip(
                cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.reqs[request_id]
            assert state.num_computed_tokens == num_computed, request_id
            state.block_ids.extend(new_block_ids)
        # Like the attention backend: write every new token's K/V first, then read.
        for request_id, num_tokens in so.num_scheduled_tokens.items():
            state = self.reqs[request_id]
            end = state.num_computed_tokens + num_tokens
            assert end <= len(state.token_ids), f"{request_id}: scheduled unknown tokens"
            for pos in range(state.num_computed_tokens, end):
                self.slots[self._slot(state, pos)] = state.fingerprints[pos]
        sampled: list[list[int]] = []
        for request_id, num_tokens in so.num_scheduled_tokens.items():
            state = self.reqs[request_id]
            state.num_computed_tokens += num_tokens
            for pos in range(state.num_computed_tokens):
                assert self.slots.get(self._slot(state, pos)) == state.fingerprints[pos], (
                    f"{request_id}: KV of position {pos} is wrong")
            if state.num_computed_tokens < len(state.token_ids):
                sampled.append([])  # mid-prefill
                continue
            token_id = self.next_token(request_id, state.num_outputs, state.fingerprints[-1])
            state.token_ids.append(token_id)
            state.append_fingerprint(token_id)
            state.num_outputs += 1
            sampled.append([token_id])
        return ModelRunnerOutput(req_ids=list(so.num_scheduled_tokens), sampled_token_ids=sampled)

    def _slot(self, state: _RunnerRequest, pos: int) -> int:
        return state.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size


def make_request(request_id: str, prompt: list[int], max_tokens: int = 8, **kwargs) -> Request:
    params = dict(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request_fields = {k: kwargs.pop(k) for k in ("priority", "eos_token_id", "cache_salt",
                                                 "arrival_time") if k in kwargs}
    params.update(kwargs)
    return Request(request_id, list(prompt), SamplingParams(**params), **request_fields)


@dataclass
class RunResult:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[EngineCoreOutput]] = field(default_factory=dict)
    finish_order: list[str] = field(default_factory=list)
    schedules: list[SchedulerOutput] = field(default_factory=list)


def run_to_completion(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 10_000,
                      check: Callable[[SchedulerOutput], None] | None = None) -> RunResult:
    """Step until every request in ``scheduler`` finishes; collect what it reported."""
    result = RunResult()
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return result
        so = scheduler.schedule()
        if check is not None:
            check(so)
        result.schedules.append(so)
        for out in scheduler.update_from_output(so, runner.execute(so)):
            result.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            result.outputs.setdefault(out.request_id, []).append(out)
            if out.finished:
                result.finish_order.append(out.request_id)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")
