"""Async scheduling (``--async-scheduling``): the engine plans step N+1 while step N runs,
with step N's tokens placeholders the worker fills in. The outputs must be exactly those
of one step at a time: greedy and seeded tokens, logprobs, finish reasons, for requests
that stop on ``max_tokens``, stop tokens and stop strings (a request that finished in
step N must not emit step N+1's token), under chunked prefill, prefix caching and
preemption, for guided decoding and n-gram drafts (whose requests wait for their step)
and with aborts. One tiny fp32 Llama; each pair of engines differs only in the flag.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner

from octavo import LLM, SamplingParams
from octavo.config import ConfigError, EngineConfig
from octavo.config.engine import resolve_async_scheduling
from octavo.engine.outputs import RequestOutput
from octavo.entrypoints.engine_args import engine_options, pop_engine_kwargs
from octavo.executor import uniproc
from octavo.sampling_params import StructuredOutputsParams
from tests.core.tiny_models import TinyModel, fresh_tiny_llama

# A 32-token budget chunks the longer prompts; 40 blocks of 16 tokens (a block of the tiny
# Llama: 16 tokens, K and V, 2 KV heads of 16, fp32, 2 layers) cannot hold the batch below
# once it decodes, so the scheduler preempts.
BLOCK_BYTES = 16 * 2 * 2 * 16 * 4 * 2
ENGINE: dict[str, Any] = dict(dtype="float32", max_num_batched_tokens=32, max_num_seqs=8,
                              max_model_len=256, seed=0, kv_cache_memory=40 * BLOCK_BYTES)
SCHEMA = {"type": "object",
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tag": {"type": "string", "enum": ["x", "y"]}},
          "required": ["id", "tag"]}
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return fresh_tiny_llama(tmp_path_factory.mktemp("tiny-async"))


def engine_pair(tiny: TinyModel, **kwargs: Any) -> Iterator[dict[bool, LLM]]:
    engines = {on: LLM(model=str(tiny.folder), async_scheduling=on, **ENGINE, **kwargs)
               for on in (False, True)}
    yield engines
    for llm in engines.values():
        llm.shutdown()


@pytest.fixture(scope="module")
def engines(tiny: TinyModel) -> Iterator[dict[bool, LLM]]:
    yield from engine_pair(tiny)


def prompts() -> list[str]:
    """Short and long (chunked) prompts, some sharing a 40-character prefix (cached)."""
    shared = "the quick brown fox jumps over the lazy dog"
    return ([f"{shared} {i}" for i in range(3)] + ["a", "hello there", "xyz" * 30]
            + [f"prompt {i} " * (i + 1) for i in range(4)])


LOGPROB_TOL = 1e-4
FIELDS = ("token ids", "text", "finish reason", "logprobs", "prompt logprobs")


def summary(outputs: list[RequestOutput]) -> list[tuple[Any, ...]]:
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason,
             o.outputs[0].logprobs, o.prompt_logprobs) for o in outputs]


def assert_same(runs: dict[bool, list[RequestOutput]], tiny: TinyModel) -> None:
    """Equal outputs with async scheduling on and off (else the first difference): the same
    tokens, texts, finish reasons, logprob token ids and ranks; logprob values within
    ``LOGPROB_TOL`` (fp32 rounding: the steps batch the requests differently, so the
    matmuls have other shapes)."""
    on, off = summary(runs[True]), summary(runs[False])
    for i, (ours, theirs) in enumerate(zip(on, off, strict=True)):
        for field, mine, reference in zip(FIELDS, ours, theirs):
            same = (close_logprobs(mine, reference) if "logprobs" in field
                    else mine == reference)
            assert same, (f"tiny seed {tiny.seed}: request {i}'s {field} differ"
                          f"\non:  {mine}\noff: {reference}")


def close_logprobs(ours: list[dict[int, Any] | None] | None,
                   theirs: list[dict[int, Any] | None] | None) -> bool:
    if ours is None or theirs is None:
        return ours is theirs
    if len(ours) != len(theirs):
        return False
    for mine, reference in zip(ours, theirs):
        if mine is None or reference is None:
            if mine is not reference:
                return False
            continue
        if [(t, e.rank) for t, e in mine.items()] != [(t, e.rank) for t, e in reference.items()]:
            return False
        if any(abs(mine[t].logprob - reference[t].logprob) > LOGPROB_TOL for t in mine):
            return False
    return True


def count_preemptions(llm: LLM) -> list[int]:
    """A counter of the scheduler's preemptions from now on (it wraps the real method)."""
    scheduler = llm.llm_engine.core.scheduler
    preempt = scheduler._preempt
    count = [0]

    def counted(request: Any) -> None:
        count[0] += 1
        preempt(request)

    scheduler._preempt = counted  # type: ignore[method-assign]
    return count


def test_same_outputs_with_stops_logprobs_seeds_chunks_and_prefix_cache(
        tiny: TinyModel, engines: dict[bool, LLM]) -> None:
    """No preemption here: a seeded request resumed after one draws from a fresh generator
    (with or without async scheduling), so where it is preempted changes its tokens."""
    texts = prompts()[:7]
    # Both engines run the same calls, so that their prefix caches hold the same blocks.
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    references = {on: llm.generate(texts, greedy, use_tqdm=False) for on, llm in engines.items()}
    assert_same(references, tiny)
    reference = references[False]
    # Stops taken from the reference run, so that they are hit mid-generation.
    stop_string = reference[1].outputs[0].text[10:13]
    stop_token = reference[2].outputs[0].token_ids[7]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, stop=[stop_string]),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=0, max_tokens=5, logprobs=2, prompt_logprobs=1),
        SamplingParams(temperature=1.0, seed=7, max_tokens=30, logprobs=1),
        SamplingParams(temperature=0.8, top_k=20, seed=11, max_tokens=33),
    ]
    preemptions = {on: count_preemptions(llm) for on, llm in engines.items()}
    runs = {on: llm.generate(texts, params, use_tqdm=False) for on, llm in engines.items()}
    assert_same(runs, tiny)
    kept = runs[True][1].outputs[0]
    assert kept.finish_reason == "stop" and stop_string not in kept.text, kept
    assert runs[True][2].outputs[0].token_ids[-1] == stop_token
    assert [len(o.outputs[0].token_ids) for o in runs[True]][3:5] == [1, 5]
    assert preemptions[True][0] == preemptions[False][0] == 0, preemptions


def test_same_greedy_tokens_under_preemption(tiny: TinyModel, engines: dict[bool, LLM]) -> None:
    texts = prompts()
    params = [SamplingParams(temperature=0, max_tokens=64 + i % 9, ignore_eos=i % 2 == 0,
                             logprobs=i % 3 or None) for i in range(len(texts))]
    preemptions = {on: count_preemptions(llm) for on, llm in engines.items()}
    runs = {on: llm.generate(texts, params, use_tqdm=False) for on, llm in engines.items()}
    assert_same(runs, tiny)
    assert preemptions[True][0] > 0 and preemptions[False][0] > 0, preemptions


def test_guided_requests_wait_for_their_step_and_match(tiny: TinyModel,
                                                      engines: dict[bool, LLM]) -> None:
    guided = SamplingParams(temperature=0, max_tokens=48,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))
    plain = SamplingParams(temperature=0, max_tokens=24)
    batch = ["abc", "the", "hello", "xyz"]
    params = [guided, plain, guided, plain]
    runs = {on: llm.generate(batch, params, use_tqdm=False) for on, llm in engines.items()}
    assert_same(runs, tiny)
    for output in (runs[True][0], runs[True][2]):
        assert output.outputs[0].finish_reason == "stop", output
        assert set(json.loads(output.outputs[0].text)) == {"id", "tag"}, output


def test_aborts_mid_generation(tiny: TinyModel, engines: dict[bool, LLM]) -> None:
    """Abort one request after a few steps; the others end exactly as without async
    scheduling, and the aborted one's tokens are a prefix of what it would have said."""
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    texts = ["one two", "three four five", "six"]
    for on, llm in engines.items():
        full = llm.generate(texts, greedy, use_tqdm=False)
        engine = llm.llm_engine
        ids = [engine.add_request(text, greedy) for text in texts]
        finished: dict[str, RequestOutput] = {}
        partial: list[int] = []
        steps = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.request_id == ids[1]:
                    partial = list(output.outputs[0].token_ids)
                if output.finished:
                    finished[output.request_id] = output  # type: ignore[assignment]
            steps += 1
            if steps == 6:
                engine.abort_request(ids[1])
        label = f"async_scheduling={on}, tiny seed {tiny.seed}"
        assert ids[1] not in finished, label
        assert 0 < len(partial) < 30, label
        assert partial == full[1].outputs[0].token_ids[:len(partial)], label
        assert [finished[i].outputs[0].token_ids for i in (ids[0], ids[2])] == \
            [full[0].outputs[0].token_ids, full[2].outputs[0].token_ids], label


@pytest.fixture(scope="module")
def ngram_engines(tiny: TinyModel) -> Iterator[dict[bool, LLM]]:
    yield from engine_pair(tiny, speculative_config=NGRAM)


def test_ngram_drafts_match(tiny: TinyModel, engines: dict[bool, LLM],
                            ngram_engines: dict[bool, LLM]) -> None:
    """Repetitive prompts, so that drafts are proposed and accepted; greedy tokens equal
    with and without async scheduling, and equal to no drafts at all."""
    texts = ["ab ab ab ab ab ab", "1 2 3 1 2 3 1 2 3", "xyz" * 30]
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = [o.outputs[0].token_ids
             for o in engines[True].generate(texts, greedy, use_tqdm=False)]
    for on, llm in ngram_engines.items():
        ours = [o.outputs[0].token_ids for o in llm.generate(texts, greedy, use_tqdm=False)]
        assert ours == plain, f"async_scheduling={on}, tiny seed {tiny.seed}"
        stats = llm.llm_engine.core.scheduler.make_stats().spec_decoding
        assert stats is not None and stats.num_accepted_tokens > 0, stats


@pytest.mark.parametrize(("setting", "named"), [
    (dict(pipeline_parallel_size=2), "pipeline_parallel_size=2"),
    (dict(distributed_executor_backend="ray"), "ray"),
    (dict(kv_transfer_config={"connector": "shared_storage", "role": "producer",
                              "path": "/nonexistent"}), "KV connector"),
    (dict(runner="pooling"), "pooling runner"),
])
def test_refused_at_start(setting: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match="async scheduling") as caught:
        EngineConfig.from_kwargs(async_scheduling=True, **setting)
    assert named in str(caught.value)


@pytest.mark.parametrize(("setting", "on"), [
    ({}, True),
    (dict(tensor_parallel_size=2), True),
    (dict(pipeline_parallel_size=2), False),
    (dict(data_parallel_size=2), False),
    (dict(distributed_executor_backend="ray"), False),
    (dict(kv_transfer_config={"connector": "shared_storage", "role": "producer",
                              "path": "/nonexistent"}), False),
    (dict(runner="pooling"), False),
    (dict(scheduler_cls="tests.core.engine.failing_scheduler.FailingScheduler"), False),
])
def test_unset_it_is_on_where_it_runs(setting: dict[str, Any], on: bool) -> None:
    """vLLM's default: unset (None), on wherever it runs and off elsewhere, not refused.
    Settled again from None, since this run's default may be off (tests/conftest.py)."""
    config = EngineConfig.from_kwargs(**setting)
    config.scheduler.async_scheduling = None
    resolve_async_scheduling(config)
    assert config.scheduler.async_scheduling is on
    assert config.scheduler.async_scheduling_by_default


@pytest.mark.parametrize(("flags", "settled"), [
    ([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)])
def test_the_flags_and_keyword(flags: list[str], settled: bool | None) -> None:
    """vLLM's flag pair; neither leaves the config to settle it, as the keyword unset does."""
    @click.command()
    @engine_options
    def command(**kwargs: Any) -> None:
        click.echo(json.dumps(pop_engine_kwargs(kwargs)["async_scheduling"]))

    result = CliRunner().invoke(command, flags)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == settled
    if settled is not None:
        config = EngineConfig.from_kwargs(async_scheduling=settled)
        assert config.scheduler.async_scheduling is settled
        assert not config.scheduler.async_scheduling_by_default


def test_the_worker_is_built_on_the_thread_that_runs_its_steps(
        tiny: TinyModel, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """With async scheduling the steps run on the ``worker-step`` thread; the model's load
    and warm-up must run there too. Built on the engine core's thread, the worker's first
    OpenMP pool stayed beside the step thread's: libgomp, counting more of its threads than
    cores, then let idle threads sleep at once, and W2 decoded at half speed on 2 cores.
    The start says it runs."""
    built: list[int] = []
    make_worker = uniproc.make_worker

    def recording(*args: Any) -> Any:
        built.append(threading.get_ident())
        return make_worker(*args)

    monkeypatch.setattr(uniproc, "make_worker", recording)
    with caplog.at_level("INFO", logger="octavo.engine.core"):
        llm = LLM(model=str(tiny.folder), async_scheduling=True, **ENGINE)
    try:
        assert "async scheduling: on" in caplog.text
        executor = llm.llm_engine.core.executor
        assert isinstance(executor, uniproc.UniProcExecutor) and executor._thread is not None
        steps_on = executor._thread.submit(threading.get_ident).result()
        assert built == [steps_on] and steps_on != threading.get_ident()
    finally:
        llm.shutdown()
