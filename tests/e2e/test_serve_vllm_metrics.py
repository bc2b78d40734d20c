"""``/metrics`` under vLLM's names: every metric vLLM's Grafana dashboard reads is exported
after traffic (names from its JSON, vllm_grafana.py), with vLLM's histogram buckets, and the
per-request families count what the requests did."""

from __future__ import annotations

from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from octavo.entrypoints.openai.metrics import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    buckets_1_2_5,
)

from .conftest import TinyModel
from .server import Server
from .vllm_grafana import DASHBOARD, DASHBOARD_SAMPLES, VLLM_COMMIT

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: Server) -> Samples:
    status, _, text = server.request("GET", "/metrics")
    assert status == 200, text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and set(labels.items()) <= sample_labels)


def buckets(samples: Samples, name: str) -> list[float]:
    return sorted({float(dict(labels)["le"]) for sample, labels in samples
                   if sample == f"{name}_bucket"} - {float("inf")})


def test_vllm_dashboard_metrics_after_traffic(tiny_server: Server, client: OpenAI,
                                              tiny_model: TinyModel) -> None:
    model = str(tiny_model.folder)
    before = scrape(tiny_server)
    client.completions.create(model=model, prompt="Count:", max_tokens=5, n=2, temperature=1.0,
                              seed=11, extra_body={"ignore_eos": True})
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=3, extra_body={"ignore_eos": True})
    after = scrape(tiny_server)
    names = {name for name, _ in after}
    missing = [name for name in DASHBOARD_SAMPLES if name not in names]
    assert not missing, f"not exported, though vLLM's {DASHBOARD} at {VLLM_COMMIT} reads them"
    # The dashboard selects by model_name (its $model_name variable): every vLLM family has it.
    assert {dict(labels).get("model_name") for name, labels in after
            if name.startswith("vllm:") and name != "vllm:cache_config_info"} == {model}

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="length") == 3  # 2 samples + 1
    assert grew("vllm:e2e_request_latency_seconds_count") == 2  # requests, not samples
    assert grew("vllm:request_generation_tokens_count") == 3
    assert grew("vllm:request_generation_tokens_sum") == 5 + 5 + 3
    assert grew("vllm:request_max_num_generation_tokens_sum") == 5 + 3
    assert grew("vllm:request_params_n_sum") == 2 + 1
    assert grew("vllm:request_params_max_tokens_sum") == 5 + 3
    assert grew("vllm:generation_tokens_total") == 13
    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:request_time_per_output_token_seconds"):
        assert grew(f"{name}_count") == 2, name
        assert grew(f"{name}_sum") >= 0, name
    assert grew("vllm:iteration_tokens_total_count") >= 1
    assert grew("vllm:num_preemptions_total") == 0
    cache_info = [dict(labels) for name, labels in after if name == "vllm:cache_config_info"]
    assert cache_info and int(cache_info[0]["num_gpu_blocks"]) > 0, cache_info
    max_model_len = 512  # the tiny model's
    assert buckets(after, "vllm:time_to_first_token_seconds") == TTFT_BUCKETS
    assert buckets(after, "vllm:inter_token_latency_seconds") == ITL_BUCKETS
    assert buckets(after, "vllm:e2e_request_latency_seconds") == REQUEST_LATENCY_BUCKETS
    assert buckets(after, "vllm:request_prompt_tokens") == buckets_1_2_5(max_model_len)
