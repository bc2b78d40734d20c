"""The offline ``LLM`` API end to end on tiny random models: prefix caching, preemption,
stop conditions, n > 1, seeds, chat, per-request metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import EOS_ID, save_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, seed=draw_seed())
    return folder


def make_llm(folder: Path, **kwargs) -> LLM:  # type: ignore[no-untyped-def]
    args = dict(dtype="float32", max_num_batched_tokens=64, kv_cache_memory=8 * 2**20)
    return LLM(model=str(folder), **{**args, **kwargs})


def shared_prefix_prompts(n: int, prefix_len: int, suffix_len: int) -> list[dict]:
    rng = np.random.default_rng(draw_seed())
    prefix = rng.integers(0, 256, prefix_len).tolist()
    return [{"prompt_token_ids": prefix + rng.integers(0, 256, suffix_len).tolist()}
            for _ in range(n)]


def token_ids(outputs) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [o.outputs[0].token_ids for o in outputs]


def test_prefix_caching_on_and_off_give_identical_outputs(tiny_llama: Path) -> None:
    prompts = shared_prefix_prompts(12, prefix_len=70, suffix_len=9)
    cached = make_llm(tiny_llama, enable_prefix_caching=True)
    uncached = make_llm(tiny_llama, enable_prefix_caching=False)
    assert token_ids(cached.generate(prompts, GREEDY)) == \
        token_ids(uncached.generate(prompts, GREEDY))
    stats = cached.llm_engine.core.scheduler.make_stats().prefix_cache
    assert stats.hits >= 11 * 64, stats  # every later request reuses the 4 full prefix blocks
    assert uncached.llm_engine.core.scheduler.make_stats().prefix_cache.hits == 0


def test_preemption_keeps_outputs_identical(tiny_llama: Path) -> None:
    rng = np.random.default_rng(draw_seed())
    prompts = [{"prompt_token_ids": rng.integers(0, 256, int(n)).tolist()}
               for n in rng.integers(20, 60, 10)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, prompt_logprobs=3)
    ample = make_llm(tiny_llama).generate(prompts, params)
    # 160 tokens of KV: two requests at most fit at once, so running ones get preempted.
    small = make_llm(tiny_llama, max_model_len=128, kv_cache_memory=10 * 16 * 2 * 2 * 2 * 16 * 4,
                     enable_prefix_caching=False)
    tight = small.generate(prompts, params)
    assert token_ids(tight) == token_ids(ample)
    assert sum(o.metrics.num_preemptions for o in tight) > 0
    # A recomputed prompt reports each position's logprobs once.
    for prompt, out_tight, out_ample in zip(prompts, tight, ample, strict=True):
        assert len(out_tight.prompt_logprobs) == len(prompt["prompt_token_ids"])
        assert [p and set(p) for p in out_tight.prompt_logprobs] == \
            [p and set(p) for p in out_ample.prompt_logprobs]


def greedy(**kwargs) -> SamplingParams:  # type: ignore[no-untyped-def]
    return SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **kwargs)


def test_stop_conditions(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama)
    # A random model can answer a prompt with tokens that decode to no text at all (seen
    # once: an empty stop string never matches): take the first prompt with 6 characters.
    for start in range(10, 250, 30):
        prompt = {"prompt_token_ids": list(range(start, start + 30))}
        free_run = llm.generate(prompt, greedy())[0].outputs[0]
        if len(free_run.text) >= 6:
            break
    assert len(free_run.text) >= 6, "no prompt gave 6 characters of text"
    stop_token = free_run.token_ids[5]
    by_token = llm.generate(prompt, greedy(stop_token_ids=[stop_token]))[0].outputs[0]
    first = free_run.token_ids.index(stop_token)
    assert by_token.token_ids == free_run.token_ids[: first + 1]
    assert by_token.finish_reason == "stop" and by_token.stop_reason == stop_token
    assert free_run.finish_reason == "length" and len(free_run.token_ids) == 24
    stop_text = free_run.text[3:6]
    by_text = llm.generate(prompt, greedy(stop=[stop_text]))[0].outputs[0]
    assert by_text.finish_reason == "stop" and by_text.stop_reason == stop_text
    assert by_text.text == free_run.text[: free_run.text.index(stop_text)]
    floor = llm.generate(prompt, greedy(min_tokens=8, stop_token_ids=[stop_token]))[0]
    assert len(floor.outputs[0].token_ids) >= 8


def test_eos_stops_unless_ignored(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama)
    params = SamplingParams(temperature=1.0, max_tokens=10, logit_bias={EOS_ID: 100.0})
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, params)[0].outputs[0]
    assert out.token_ids == [EOS_ID] and out.finish_reason == "stop"
    params.ignore_eos = True
    assert len(llm.generate({"prompt_token_ids": [1, 2, 3]}, params)[0].outputs[0].token_ids) == 10


def test_seed_reproducible_whatever_the_batch(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=1234)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    alone = llm.generate(prompt, seeded)[0].outputs[0].token_ids
    others = shared_prefix_prompts(5, 10, 10)
    crowd = llm.generate(others[:3] + [prompt] + others[3:],
                         [SamplingParams(temperature=1.0, max_tokens=16)] * 3 + [seeded]
                         + [SamplingParams(temperature=1.0, max_tokens=16)] * 2)
    assert crowd[3].outputs[0].token_ids == alone


def test_n_samples_and_logprobs(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama)
    out = llm.generate({"prompt_token_ids": [9, 8, 7]},
                       SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7, logprobs=2,
                                      ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    for completion in out.outputs:
        assert len(completion.logprobs) == 8
        for token, step in zip(completion.token_ids, completion.logprobs):
            assert token in step and len(step) <= 3
        assert completion.cumulative_logprob == pytest.approx(
            sum(step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)))


def test_chat_and_metrics(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama)
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY)[0]
    expected = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False)
    assert out.prompt_token_ids == list(expected)
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_bad_input_is_named(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama, max_model_len=64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1, 10**6]}, GREEDY)
    with pytest.raises(ValueError, match="max_model_len is 64"):
        llm.generate({"prompt_token_ids": list(range(64))}, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", GREEDY)
    with pytest.raises(ValueError, match="logit_bias has token ids outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1]}, SamplingParams(logit_bias={10**6: 1.0}))
    # The engine still serves after rejecting bad requests.
    assert len(llm.generate({"prompt_token_ids": [1, 2]}, GREEDY)[0].outputs[0].token_ids) == 24


def test_prompt_logprobs_match_hf_across_chunks(tmp_path: Path) -> None:
    import torch

    seed = draw_seed()
    hf = save_tiny_model("qwen2", tmp_path, seed)
    llm = make_llm(tmp_path, max_num_batched_tokens=16)  # a 50-token prompt takes 4 chunks
    prompt = np.random.default_rng(seed).integers(0, 256, 50).tolist()
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for pos in range(1, len(prompt)):
        step = out.prompt_logprobs[pos]
        assert step is not None and prompt[pos] in step
        assert step[prompt[pos]].logprob == pytest.approx(ref[pos - 1, prompt[pos]].item(),
                                                          abs=1e-4), f"seed {seed} pos {pos}"
        top = ref[pos - 1].topk(3).indices.tolist()
        assert set(top) <= set(step), f"seed {seed} pos {pos}"


def test_bfloat16_engine_generates(tiny_llama: Path) -> None:
    """bf16 numerics are checked against HF's bf16 at the model level
    (test_models_parity); here the whole engine runs in bf16, KV cache included."""
    import torch

    llm = make_llm(tiny_llama, dtype="bfloat16")
    out = llm.generate({"prompt_token_ids": [3, 1, 4, 1, 5]}, GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 24
    runner = llm.llm_engine.core.executor.worker.runner
    assert runner.kv_caches[0].dtype == torch.bfloat16
    assert next(runner.model.parameters()).dtype == torch.bfloat16


def test_octavo_chat_streams_replies(tiny_llama: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "octavo", "chat", "--model", str(tiny_llama), "--max-tokens", "8",
         "--kv-cache-memory", "8MiB", "--system", "be brief"],
        input="hello\nand again\n\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("model> ") == 2, result.stdout
