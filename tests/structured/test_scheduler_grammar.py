"""The scheduler with a ``StructuredOutputManager`` on the tiny byte-level tokenizer: a
request whose grammar compiles waits without holding up others; each step's bitmask allows
exactly what the grammar allows next; the matcher follows the tokens; a complete grammar
finishes the request, a rejected token aborts it."""

from __future__ import annotations

import threading

import pytest

from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.request import RequestStatus
from octavo.sampling_params import StructuredOutputsParams
from octavo.sched.scheduler import Scheduler
from octavo.sched.structured_outputs import StructuredOutputManager
from tests.core.scheduler_fakes import make_request, make_scheduler
from tests.core.tiny_models import EOS_ID, VOCAB_SIZE, tiny_tokenizer

from .bits import allowed_ids

DIGITS = StructuredOutputsParams(regex="[0-9]{3}")


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def digit_ids(tokenizer) -> list[int]:  # type: ignore[no-untyped-def]
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(d))[0] for d in "0123456789"]


def _scheduler(tokenizer) -> tuple[Scheduler, StructuredOutputManager]:  # type: ignore[no-untyped-def]
    manager = StructuredOutputManager(tokenizer, VOCAB_SIZE, [EOS_ID])
    scheduler = make_scheduler(num_blocks=64, max_model_len=64, block_size=4, max_num_seqs=8,
                               max_num_batched_tokens=64, structured_output=manager)
    return scheduler, manager


def _allowed(output: SchedulerOutput, request_id: str) -> set[int]:
    assert output.grammar_bitmask is not None
    row = output.structured_output_request_ids.index(request_id)
    return allowed_ids(output.grammar_bitmask[row], VOCAB_SIZE)


def _step(scheduler: Scheduler, tokens: dict[str, int]) -> SchedulerOutput:
    """Schedule a step and return it with ``tokens`` sampled for the requests it ran."""
    output = scheduler.schedule()
    ids = list(output.num_scheduled_tokens)
    scheduler.update_from_output(output, ModelRunnerOutput(
        req_ids=ids, sampled_token_ids=[[tokens[i]] if i in tokens else [] for i in ids]))
    return output


def test_compiling_grammar_holds_up_nobody(tokenizer, digit_ids) -> None:  # type: ignore[no-untyped-def]
    scheduler, manager = _scheduler(tokenizer)
    gate = threading.Event()
    busy = [manager.cache._executor.submit(gate.wait) for _ in range(2)]  # every compile thread
    try:
        scheduler.add_request(make_request("g", [5, 6, 7], structured_outputs=DIGITS))
        scheduler.add_request(make_request("p", [8, 9]))
        first = _step(scheduler, {"p": 11})
        assert list(first.num_scheduled_tokens) == ["p"]
        assert first.grammar_bitmask is None
        assert scheduler.requests["g"].status is RequestStatus.WAITING_FOR_GRAMMAR
    finally:
        gate.set()
    for future in busy:
        future.result(timeout=30)
    manager.cache.get(DIGITS.kind, DIGITS.spec).result(timeout=60)
    second = _step(scheduler, {"p": 12, "g": digit_ids[4]})
    assert set(second.num_scheduled_tokens) == {"p", "g"}
    assert second.structured_output_request_ids == ["g"]
    assert _allowed(second, "g") == set(digit_ids)


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_complete_grammar_finishes_the_request(tokenizer, digit_ids, ignore_eos: bool) -> None:  # type: ignore[no-untyped-def]
    scheduler, manager = _scheduler(tokenizer)
    request = make_request("g", [5, 6], max_tokens=20, eos_token_id=EOS_ID,
                           ignore_eos=ignore_eos, structured_outputs=DIGITS)
    scheduler.add_request(request)
    manager.cache.get(DIGITS.kind, DIGITS.spec).result(timeout=60)
    for digit in (1, 2, 3):
        output = _step(scheduler, {"g": digit_ids[digit]})
        assert _allowed(output, "g") == set(digit_ids)
    output = _step(scheduler, {"g": EOS_ID})
    assert _allowed(output, "g") == {EOS_ID}  # three digits: only the end is left
    assert request.status is RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [*digit_ids[1:4], EOS_ID]
    assert "g" not in scheduler.requests
    assert "g" in output.num_scheduled_tokens


def test_rejected_token_aborts(tokenizer, digit_ids) -> None:  # type: ignore[no-untyped-def]
    scheduler, manager = _scheduler(tokenizer)
    request = make_request("g", [5, 6], structured_outputs=DIGITS)
    scheduler.add_request(request)
    manager.cache.get(DIGITS.kind, DIGITS.spec).result(timeout=60)
    _step(scheduler, {"g": 40})  # not a digit
    assert request.status is RequestStatus.FINISHED_ABORTED
    assert "g" not in scheduler.requests

