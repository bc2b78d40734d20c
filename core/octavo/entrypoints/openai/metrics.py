"""``/metrics``: the server's Prometheus metrics (vLLM's set, under ``octavo:`` names).

Gauges follow the scheduler's state as the engine core reports it after each step (and
after aborts, when no step follows); counters and latency histograms are fed from what
the API process sees of each batch of outputs (``IterationStats``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from octavo.engine.async_llm import IterationStats
from octavo.outputs import SchedulerStats
from octavo.stats import KVTransferStats, SpecDecodingStats

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0]
ITL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


class PrometheusMetrics:
    """A ``StatLogger`` with its own registry (so servers in one process do not clash)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=buckets,
                             registry=self.registry).labels(**labels)

        self.running = gauge("octavo:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("octavo:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("octavo:kv_cache_usage_perc",
                              "Share of KV-cache blocks held by requests (1 = full).")
        self.prefix_hit_rate = gauge("octavo:prefix_cache_hit_rate",
                                     "Share of prompt tokens served from the prefix cache.")
        self.prefix_queries = counter("octavo:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("octavo:prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.")
        self.prompt_tokens = counter("octavo:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("octavo:generation_tokens", "Tokens generated.")
        self.ttft = histogram("octavo:time_to_first_token_seconds",
                              "Time from arrival to the first output token.", TTFT_BUCKETS)
        self.itl = histogram("octavo:inter_token_latency_seconds",
                             "Time between consecutive outputs of a request.", ITL_BUCKETS)
        self.e2e = histogram("octavo:e2e_request_latency_seconds",
                             "Time from arrival to the last output token.", E2E_BUCKETS)
        self._seen_queries = 0
        self._seen_hits = 0
        self.kv_transfer = {
            name: counter(f"octavo:kv_transfer_{name}", doc) for name, doc in (
                ("loads", "Requests whose prompt KV a KV connector loaded."),
                ("loaded_tokens", "Prompt tokens loaded by a KV connector, not computed."),
                ("failed_loads", "KV loads that failed (those prompts were computed)."),
                ("saves", "Requests whose prompt KV a KV connector saved."))}
        self._seen_kv_transfer = KVTransferStats()
        # Speculative decoding, vLLM's spec_decode_* counters (present, at 0, when off).
        self.spec_drafts = counter("octavo:spec_decode_num_drafts",
                                   "Verification steps of requests that had drafts.")
        self.spec_draft_tokens = counter("octavo:spec_decode_num_draft_tokens",
                                         "Draft tokens proposed and verified.")
        self.spec_accepted = counter("octavo:spec_decode_num_accepted_tokens",
                                     "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter(
            "octavo:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (0 = first).",
            [*labels, "position"], registry=self.registry)
        self._model_name = model_name
        self._seen_spec = SpecDecodingStats()

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats) -> None:
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats)
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        for value in iteration.time_to_first_tokens:
            self.ttft.observe(value)
        for value in iteration.inter_token_latencies:
            self.itl.observe(value)
        for value in iteration.e2e_latencies:
            self.e2e.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _record_scheduler(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        prefix = stats.prefix_cache  # totals since the engine started
        self.prefix_hit_rate.set(prefix.hit_rate)
        _add_total(self.prefix_queries, prefix.queries, self._seen_queries)
        _add_total(self.prefix_hits, prefix.hits, self._seen_hits)
        self._seen_queries, self._seen_hits = prefix.queries, prefix.hits
        for name, counter in self.kv_transfer.items():  # totals since the engine started
            _add_total(counter, getattr(stats.kv_transfer, name),
                       getattr(self._seen_kv_transfer, name))
        self._seen_kv_transfer = stats.kv_transfer
        if stats.spec_decoding is not None:  # totals since the engine started
            new = stats.spec_decoding.since(self._seen_spec)
            if new.num_drafts < 0:  # a restarted engine's totals
                new = stats.spec_decoding
            self.spec_drafts.inc(new.num_drafts)
            self.spec_draft_tokens.inc(new.num_draft_tokens)
            self.spec_accepted.inc(new.num_accepted_tokens)
            for position, count in enumerate(new.accepted_per_position):
                self.spec_accepted_per_pos.labels(model_name=self._model_name,
                                                  position=str(position)).inc(count)
            self._seen_spec = stats.spec_decoding


def _add_total(counter: Counter, total: int, seen: int) -> None:
    """Count what a total since the engine started added; a total below the last one seen
    is a new engine's (restarted, ``--restart-engine``), counted from zero."""
    counter.inc(total - seen if total >= seen else total)
