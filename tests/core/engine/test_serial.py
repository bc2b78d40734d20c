"""The wire between the API process and the engine core: every message kind survives an
encode/decode round trip exactly, numpy arrays included, and so does a payload cut into
frames for TCP (``split_payload``)."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.engine.serial import (
    Decoder,
    Encoder,
    OutputKind,
    RequestKind,
    join_payload,
    split_payload,
)
from octavo.outputs import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    LogprobsLists,
    SchedulerStats,
    UtilityCall,
    UtilityResult,
)
from octavo.request import Request
from octavo.sampling_params import SamplingParams
from octavo.stats import PrefixCacheStats
from octavo.testing.seeds import draw_seed


@pytest.fixture
def rng() -> tuple[np.random.Generator, int]:
    seed = draw_seed()
    return np.random.default_rng(seed), seed


def round_trip(kind: RequestKind | OutputKind, payload: object) -> object:
    frames = Encoder().encode(kind, payload)
    decoded_kind, decoded = Decoder(type(kind)).decode(frames)
    assert decoded_kind is kind
    return decoded


def random_request(rng: np.random.Generator) -> Request:
    params = SamplingParams(
        n=1, temperature=float(rng.uniform(0, 2)), top_p=float(rng.uniform(0.1, 1)),
        top_k=int(rng.integers(0, 50)), seed=int(rng.integers(1 << 40)),
        stop=["\n\n", "END"], stop_token_ids=[int(t) for t in rng.integers(0, 1000, 3)],
        max_tokens=int(rng.integers(1, 100)), logprobs=int(rng.integers(0, 5)),
        logit_bias={int(t): float(rng.normal()) for t in rng.integers(0, 1000, 4)},
        bad_words=["bad"])
    params._bad_words_token_ids = [[1, 2], [3]]  # filled by the Processor before sending
    return Request(request_id=f"req-{rng.integers(1000)}",
                   prompt_token_ids=[int(t) for t in rng.integers(0, 50000, 40)],
                   sampling_params=params, priority=int(rng.integers(-5, 5)), eos_token_id=2,
                   events=[EngineCoreEvent.now(EngineCoreEventType.QUEUED)])


def test_request_round_trip(rng: tuple[np.random.Generator, int]) -> None:
    generator, seed = rng
    request = random_request(generator)
    decoded = round_trip(RequestKind.ADD, request)
    assert decoded == request, f"seed {seed}"
    assert decoded.sampling_params.bad_words_token_ids == [[1, 2], [3]]


def test_abort_utility_and_shutdown_round_trip() -> None:
    assert round_trip(RequestKind.ABORT, ["a", "b_1"]) == ["a", "b_1"]
    call = UtilityCall(7, "reset_prefix_cache", [1, "x", [2.5]])
    assert round_trip(RequestKind.UTILITY, call) == call
    assert round_trip(RequestKind.SHUTDOWN, None) is None
    result = UtilityResult(7, result={"blocks": 3}, error=None)
    assert round_trip(OutputKind.UTILITY_RESULT, result) == result


def test_outputs_with_numpy_logprobs_round_trip(rng: tuple[np.random.Generator, int]) -> None:
    generator, seed = rng
    outputs = []
    for i in range(5):
        rows, top = int(generator.integers(1, 4)), int(generator.integers(0, 6))
        logprobs = LogprobsLists(
            token_ids=generator.integers(0, 50000, (rows, top + 1)).astype(np.int64),
            logprobs=-generator.random((rows, top + 1), dtype=np.float32),
            ranks=generator.integers(1, 100, rows).astype(np.int64))
        outputs.append(EngineCoreOutput(
            request_id=str(i), new_token_ids=[int(t) for t in logprobs.token_ids[:, 0]],
            finish_reason="length" if i % 2 else None, new_logprobs=logprobs,
            num_cached_tokens=16 * i,
            events=[EngineCoreEvent.now(EngineCoreEventType.SCHEDULED)]))
    stats = SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.25,
                           prefix_cache=PrefixCacheStats(requests=4, queries=100, hits=48))
    decoded = round_trip(OutputKind.OUTPUTS, EngineCoreOutputs(outputs, stats))
    assert decoded.scheduler_stats == stats
    for got, sent in zip(decoded.outputs, outputs, strict=True):
        for name in ("token_ids", "logprobs", "ranks"):
            got_array, sent_array = getattr(got.new_logprobs, name), getattr(sent.new_logprobs,
                                                                               name)
            assert got_array.dtype == sent_array.dtype, f"seed {seed}"
            np.testing.assert_array_equal(got_array, sent_array, err_msg=f"seed {seed}")
        got.new_logprobs = sent.new_logprobs = None
        assert got == sent, f"seed {seed}"


def test_a_payload_cut_into_frames_round_trips(rng: tuple[np.random.Generator, int]) -> None:
    generator, seed = rng
    ids = generator.integers(0, 50000, 3000).astype(np.int64)
    output = EngineCoreOutput(request_id="r", new_token_ids=[int(t) for t in ids])
    frames = Encoder().encode(OutputKind.OUTPUTS, EngineCoreOutputs([output],
                                                                    SchedulerStats.stopped()))
    limit = 1000
    split = split_payload(frames, limit)
    assert len(split) == 1 + -(-len(frames[1]) // limit) and max(map(len, split)) <= limit
    kind, decoded = Decoder(OutputKind).decode(join_payload(split))
    assert kind is OutputKind.OUTPUTS and decoded.outputs == [output], f"seed {seed}"
    empty = split_payload([OutputKind.OUTPUTS.value, b""], limit)  # still two frames
    assert empty == [OutputKind.OUTPUTS.value, b""] and join_payload(empty) == empty


def test_unknown_message_kind_is_an_error() -> None:
    with pytest.raises(ValueError):
        Decoder(OutputKind).decode([b"\x09", b""])
