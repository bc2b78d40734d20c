"""The metric names vLLM's Grafana dashboard reads, as its queries spell them (samples:
histograms by their ``_bucket``/``_sum``/``_count``, counters by their ``_total``).

Taken from ``examples/observability/prometheus_grafana/grafana.json`` in vLLM's repository
(https://github.com/vllm-project/vllm) at the commit below: every ``vllm:...`` name in the
dashboard's ``expr`` fields.
"""

VLLM_COMMIT = "4b5c627c23e6690b8987100d1cbf78e34ac14bf9"
DASHBOARD = "examples/observability/prometheus_grafana/grafana.json"

DASHBOARD_SAMPLES = (
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)
