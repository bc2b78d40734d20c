"""``octavo serve --speculative-config``: the engine-core process speculates, completions
match offline greedy decoding without speculation, and /metrics exports the acceptance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.e2e.server import Server

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}'


def test_served_completions_speculate_and_report(tmp_path: Path) -> None:
    seed = draw_seed()
    save_tiny_model("llama", tmp_path / "model", seed=seed)
    rng = np.random.default_rng(seed)
    passage = rng.integers(0, 256, 40).tolist()
    prompt = passage + passage[:20]  # repeats itself: n-gram lookup finds matches
    server = Server(["--model", str(tmp_path / "model"), "--dtype", "float32",
                     "--kv-cache-memory", "16MiB", "--speculative-config", NGRAM],
                    tmp_path / "server.log")
    try:
        server.wait_ready(timeout=180)
        status, _, body = server.request("POST", "/v1/completions", {
            "model": str(tmp_path / "model"), "prompt": prompt, "max_tokens": 32,
            "temperature": 0.0, "ignore_eos": True})
        assert status == 200, body
        # Whether the random model's own continuation repeats is chance; a request whose
        # logit_bias makes it repeat one token gets drafts (and acceptances) for certain.
        status, _, repeating = server.request("POST", "/v1/completions", {
            "model": str(tmp_path / "model"), "prompt": prompt, "max_tokens": 16,
            "temperature": 0.0, "ignore_eos": True, "logit_bias": {str(passage[0]): 100}})
        assert status == 200, repeating
        metrics = server.metrics()
    finally:
        server.stop()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        offline = LLM(model=str(tmp_path / "model"), dtype="float32",
                      kv_cache_memory=16 * 2**20).generate(
            [{"prompt_token_ids": prompt}],
            SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    finally:
        torch.set_num_threads(threads)
    assert body["choices"][0]["text"] == offline[0].outputs[0].text, f"seed={seed}"
    assert metrics["vllm:spec_decode_num_drafts_total"] > 0, f"seed={seed}"
    drafted = metrics["vllm:spec_decode_num_draft_tokens_total"]
    accepted = metrics["vllm:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= drafted, f"seed={seed}: {accepted} of {drafted}"
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in metrics
