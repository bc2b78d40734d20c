"""``AsyncLLM`` with its engine core in another process, on a tiny random model: the same
outputs as the offline ``LLM``, streamed text that never shows a stop string, aborts that
free KV blocks, and utility calls."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from octavo import LLM, SamplingParams
from octavo.config import EngineConfig
from octavo.engine.async_llm import AsyncLLM
from octavo.outputs import SchedulerStats
from octavo.testing.seeds import draw_seed
from tests.core.loop_engine import LoopEngine
from tests.core.tiny_models import save_tiny_model

ENGINE_ARGS = dict(dtype="float32", kv_cache_memory=8 * 2**20)


class Harness(LoopEngine):
    """The ``AsyncLLM``, plus the offline engine on the same model."""

    def __init__(self, folder: Path, seed: int) -> None:
        super().__init__(EngineConfig.from_kwargs(model=str(folder), **ENGINE_ARGS))
        self.seed = seed
        self.offline = LLM(model=str(folder), **ENGINE_ARGS)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, single_thread: None) -> Iterator[Harness]:
    seed = draw_seed()
    folder = tmp_path_factory.mktemp("tiny-llama-async")
    save_tiny_model("llama", folder, seed=seed)
    harness = Harness(folder, seed)
    try:
        yield harness
    finally:
        harness.close()


async def final(engine: AsyncLLM, prompt: Any, params: SamplingParams, request_id: str) -> Any:
    outputs = [output async for output in engine.generate(prompt, params, request_id)]
    return outputs[-1]


def test_concurrent_requests_match_the_offline_engine(harness: Harness) -> None:
    rng = np.random.default_rng(draw_seed())
    prompts = [{"prompt_token_ids": rng.integers(0, 256, int(n)).tolist()}
               for n in rng.integers(3, 40, 8)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
              for n in rng.integers(4, 20, 8)]
    seeded = SamplingParams(temperature=1.0, n=2, seed=int(rng.integers(1 << 31)),
                            max_tokens=12, ignore_eos=True)
    params = [*greedy[:-1], seeded]

    async def run_all() -> list[Any]:
        return await asyncio.gather(*[final(harness.engine, p, sp, f"r{i}")
                                      for i, (p, sp) in enumerate(zip(prompts, params))])

    served = harness.run(run_all())
    expected = harness.offline.generate(prompts, params, use_tqdm=False)
    for got, want in zip(served, expected, strict=True):
        assert got.finished
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs], \
            f"model seed {harness.seed}, seeded params {seeded.seed}"
        assert [c.text for c in got.outputs] == [c.text for c in want.outputs]


def test_streamed_text_grows_and_never_shows_the_stop_string(harness: Harness) -> None:
    tokenizer = harness.engine.tokenizer
    bias = {tokenizer.encode(ch, add_special_tokens=False)[0]: 100.0 for ch in "abc "}
    seed = draw_seed()
    base = dict(temperature=1.0, seed=seed, max_tokens=40, ignore_eos=True, logit_bias=bias)
    text = harness.offline.generate("letters:", SamplingParams(**base),
                                    use_tqdm=False)[0].outputs[0].text
    cut = next((i for i in range(4, 30) if text.find(text[i : i + 4]) == i), None)
    assert cut is not None, (text, seed)
    stop = text[cut : cut + 4]

    async def snapshots() -> list[str]:
        params = SamplingParams(**base, stop=[stop])
        return [out.outputs[0].text
                async for out in harness.engine.generate("letters:", params, "stop")]

    texts = harness.run(snapshots())
    assert texts[-1] == text[:cut], (text, stop, seed)
    for earlier, later in zip(texts, texts[1:]):
        assert later.startswith(earlier), (texts, seed)  # streamed text is never taken back
    assert not any(stop in t for t in texts), (texts, stop, seed)


async def idle_stats(harness: Harness) -> SchedulerStats | None:
    """The core's newest state once it reports no running request (it reports once it is
    idle again), or the newest after 4 s."""
    for _ in range(200):
        await asyncio.sleep(0.02)
        stats = harness.stats.latest
        if stats is not None and stats.num_running_reqs == 0:
            break
    return harness.stats.latest


def test_closing_or_aborting_a_stream_frees_its_blocks(harness: Harness) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def consume(stream: Any) -> list[Any]:
        return [output async for output in stream]

    async def read_two_then_leave() -> SchedulerStats | None:
        stream = await harness.engine.add_request("a long story", params, "leaver")
        aborted = asyncio.ensure_future(consume(await harness.engine.add_request(
            "another", params, "aborted")))
        outputs = [await anext(stream), await anext(stream)]
        assert not outputs[-1].finished
        await stream.aclose()
        harness.engine.abort("aborted")
        assert not any(o.finished for o in await aborted)  # its consumer ends: no hang
        return await idle_stats(harness)

    stats = harness.run(read_two_then_leave())
    assert stats is not None and stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0
    assert harness.engine.num_unfinished_requests == 0


def test_a_stopped_core_is_seen_stalled_and_fail_ends_its_requests(harness: Harness) -> None:
    """SIGSTOP the core under a running request: past the timeout the ``StallWatch`` names
    it, ``fail_running`` (``--engine-stall-action fail``) ends the request with
    ``EngineStalledError``; after SIGCONT the core reports again and serves."""
    from octavo.engine.errors import EngineStalledError

    engine = harness.engine
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    engine.stall_watch.timeout_s = 0.5

    async def stall_then_fail() -> tuple[dict[int, float], BaseException | None]:
        stream = await engine.add_request("a long story", params, "stalled")
        await anext(stream)
        os.kill(engine.ready.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while not (silences := engine.stall_watch.silences(time.monotonic())):
                assert time.monotonic() < deadline, "not seen stalled in 10 s"
                await asyncio.sleep(0.05)
            engine.fail_running(EngineStalledError("stalled"))
            try:
                async for _ in stream:
                    pass
                error = None
            except EngineStalledError as exc:
                error = exc
        finally:
            os.kill(engine.ready.pid, signal.SIGCONT)
        return silences, error

    try:
        silences, error = harness.run(stall_then_fail())
    finally:
        engine.stall_watch.timeout_s = None
    assert list(silences) == [0] and silences[0] > 0.5, silences
    assert isinstance(error, EngineStalledError), error
    assert engine.num_unfinished_requests == 0
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    assert len(harness.run(final(engine, "after", short, "after")).outputs[0].token_ids) == 2


def test_reset_prefix_cache_is_a_utility_call(harness: Harness) -> None:
    prompt = {"prompt_token_ids": list(range(1, 70))}  # four full blocks
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)

    async def cached_tokens(request_id: str) -> int:
        return (await final(harness.engine, prompt, params, request_id)).num_cached_tokens

    first = harness.run(cached_tokens("p1"))
    assert harness.run(cached_tokens("p2")) == 64 > first
    harness.run(harness.engine.reset_prefix_cache())
    assert harness.run(cached_tokens("p3")) == 0
    with pytest.raises(RuntimeError, match="no method 'no_such_method'"):
        harness.run(harness.engine.client.call_utility("no_such_method"))


def test_a_request_the_core_refuses_fails_alone(harness: Harness,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """What slips past the front end (here: a front end that believes the context is longer
    than the core's) is refused by the core with a per-request error; the core lives on."""
    from octavo.engine.errors import InvalidRequestError

    engine = harness.engine
    too_long = [7] * (engine.max_model_len + 5)
    monkeypatch.setattr(engine.processor, "max_model_len", 10 * engine.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        harness.run(final(engine, {"prompt_token_ids": too_long}, params, "refused"))
    assert "refused" not in engine._states
    monkeypatch.undo()
    ok = harness.run(final(engine, {"prompt_token_ids": [1, 2, 3]}, params, "after"))
    assert len(ok.outputs[0].token_ids) == 2


def test_an_undecodable_frame_is_dropped(harness: Harness) -> None:
    """A frame that is not a message (a local process writing to the socket, say) is logged
    and dropped; it is never a reason for the core to die."""
    engine = harness.engine

    async def send_garbage() -> None:
        await engine.client._input.send_multipart([b"\x00not msgpack", b"\xff"])

    harness.run(send_garbage())
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    ok = harness.run(final(engine, {"prompt_token_ids": [4, 5, 6]}, params, "after-garbage"))
    assert len(ok.outputs[0].token_ids) == 2
    engine.check_health()


async def _max_tick_while(work: Any) -> tuple[Any, float]:
    """``work``'s outcome (its result, or the exception it raised) and the longest gap
    between the 10 ms ticks of another task meanwhile: how long the event loop stalled."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    try:
        outcome = await work
    except Exception as exc:
        outcome = exc
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    return outcome, max(gaps, default=0.0)


@pytest.mark.timed
def test_a_huge_prompt_is_tokenized_off_the_loop_and_leaves_nothing(harness: Harness) -> None:
    """Megabytes of prompt take a while to tokenize: on a processing thread, while the event
    loop runs on. Too long to serve, the request fails without a trace, as does one whose
    caller gives up while it is processed."""
    from octavo.engine.errors import InvalidRequestError

    engine = harness.engine
    prompt = "a story " * 200_000  # 1.6 MB, as many tokens: the tiny tokenizer's are bytes
    params = SamplingParams(temperature=0.0, max_tokens=2)

    async def refused() -> tuple[Any, float, float]:
        start = time.monotonic()
        outcome, stall = await _max_tick_while(engine.add_request(prompt, params, "huge"))
        return outcome, stall, time.monotonic() - start

    outcome, stall, took = harness.run(refused())
    assert isinstance(outcome, InvalidRequestError) and "max_model_len" in str(outcome)
    assert took > 0.5 and stall < 0.25, (took, stall)  # the work was real; the loop ran on

    async def given_up() -> None:
        task = asyncio.ensure_future(engine.add_request(prompt, params, "given-up"))
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(took + 0.5)  # the thread, which runs on, has finished

    harness.run(given_up())
    assert engine.num_unfinished_requests == 0 and not engine._states
    ok = harness.run(final(engine, {"prompt_token_ids": [1, 2, 3]},
                           SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
                           "after-huge"))
    assert len(ok.outputs[0].token_ids) == 2


def test_a_window_stream_closed_unread_aborts_its_prompt(harness: Harness) -> None:
    """A response abandoned before its first read: closing the window's streams of prompts
    already sent, never iterated, aborts them (a bare generator's close would run none of
    its code, and they would run to max_tokens for nobody)."""
    from octavo.entrypoints.openai.admission import SequenceWindow

    engine = harness.engine
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def send_then_leave() -> SchedulerStats | None:
        async def prepared() -> Any:
            for index in range(3):
                yield await engine.prepare(f"story {index}", params, f"unread-{index}")

        window = SequenceWindow(engine, size=2, sequences_per_prompt=1)
        streams = await window.streams(prepared())  # two sent, the third held back
        assert engine.num_unfinished_requests == 2
        for stream in streams:
            await stream.aclose()
        assert engine.num_unfinished_requests == 0
        return await idle_stats(harness)

    stats = harness.run(send_then_leave())
    assert stats is not None and stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0
