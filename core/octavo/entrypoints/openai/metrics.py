"""``/metrics``: the server's Prometheus metrics, under vLLM's ``vllm:`` names and buckets,
so that vLLM's Grafana dashboards and alerts read an Octavo server unchanged.

Every sample carries the labels ``model_name`` and ``engine`` (the data-parallel rank of the
engine it describes, as vLLM's do), so a server with several engines shows each one's
waiting and running requests and KV usage; sum over ``engine`` for the server's.

Gauges follow the scheduler's state as each engine core reports it after each step (and
after aborts, when no step follows); counters and histograms are fed from what the API
process sees of each batch of outputs (``IterationStats``). Three families are Octavo's
own, with no vLLM counterpart, and keep the ``octavo:`` prefix: ``octavo:prefix_cache_hit_rate``,
the KV connector's ``octavo:kv_transfer_*`` counters and ``octavo:engine_stalled``.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from octavo.engine.async_llm import FinishedRequestStats, IterationStats
from octavo.outputs import SchedulerStats
from octavo.stats import KVTransferStats, SpecDecodingStats

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
FINISH_REASONS = ("stop", "length", "abort", "error")
LABELS = ("model_name", "engine")
KV_TRANSFER_COUNTERS = (
    ("loads", "Requests whose prompt KV a KV connector loaded."),
    ("loaded_tokens", "Prompt tokens loaded by a KV connector, not computed."),
    ("failed_loads", "KV loads that failed (those prompts were computed)."),
    ("saves", "Requests whose prompt KV a KV connector saved."))


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


@dataclass(frozen=True)
class CacheInfo:
    """What ``vllm:cache_config_info`` shows of the KV cache (label values)."""

    block_size: int
    num_gpu_blocks: int  # vLLM's label name: the blocks of the KV pool, on any device
    enable_prefix_caching: bool


class _Families:
    """The metric families, registered once; each engine gets its labelled children."""

    def __init__(self, registry: CollectorRegistry, max_model_len: int) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry)

        def histogram(name: str, doc: str, buckets: list[float] | list[int]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=registry)

        tokens = buckets_1_2_5(max_model_len)
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "Share of KV-cache blocks held by requests (1 = full).")
        self.prefix_hit_rate = gauge("octavo:prefix_cache_hit_rate",
                                     "Share of prompt tokens served from the prefix cache.")
        self.stalled = gauge("octavo:engine_stalled",
                             "1 while the engine has work and has finished no step for "
                             "--engine-stall-timeout seconds, else 0.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("vllm:num_preemptions",
                                   "Requests preempted (their KV blocks taken back).")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Prompt and generated tokens per batch of outputs.",
                                          ITERATION_TOKEN_BUCKETS)
        self.prompt_len = histogram("vllm:request_prompt_tokens",
                                    "Prompt tokens of each finished request.", tokens)
        self.generation_len = histogram("vllm:request_generation_tokens",
                                        "Tokens generated by each finished sample.", tokens)
        self.max_generation_len = histogram(
            "vllm:request_max_num_generation_tokens",
            "Tokens generated by the longest sample of each finished request.", tokens)
        self.n_param = histogram("vllm:request_params_n", "The n of each finished request.",
                                 N_BUCKETS)
        self.max_tokens_param = histogram("vllm:request_params_max_tokens",
                                          "The max_tokens of each finished request.", tokens)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Time from arrival to the first output token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Time between consecutive outputs of a request.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Decode time of a finished request over its tokens after the "
                              "first.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Time from arrival to the last output token.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Time a finished request waited to be first scheduled.",
                                    REQUEST_LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Time a finished request spent running (prefill and "
                                        "decode).", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Time from first scheduled to first token.",
                                      REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Time from first token to last token.",
                                     REQUEST_LATENCY_BUCKETS)
        self.success = Counter("vllm:request_success", "Finished samples by finish reason.",
                               [*LABELS, "finished_reason"], registry=registry)
        self.kv_transfer = {name: counter(f"octavo:kv_transfer_{name}", doc)
                            for name, doc in KV_TRANSFER_COUNTERS}
        # Speculative decoding, vLLM's spec_decode_* counters (present, at 0, when off).
        self.spec_drafts = counter("vllm:spec_decode_num_drafts",
                                   "Verification steps of requests that had drafts.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                         "Draft tokens proposed and verified.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens",
                                     "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (0 = first).",
            [*LABELS, "position"], registry=registry)
        self.cache_info = Gauge("vllm:cache_config_info", "The KV cache's configuration.",
                                ["engine", "block_size", "num_gpu_blocks",
                                 "enable_prefix_caching"], registry=registry)
        # vLLM's: one sample per engine whose labels name the adapters of the running and
        # waiting requests (comma-separated), its value the time of the snapshot.
        self.lora_info = Gauge("vllm:lora_requests_info", "Running and waiting LoRA adapters.",
                               ["engine", "max_lora", "waiting_lora_adapters",
                                "running_lora_adapters"], registry=registry)

    def per_engine(self) -> list[Gauge | Counter | Histogram]:
        """The families with one child per engine, labelled by ``LABELS`` alone."""
        extra = (self.success, self.spec_accepted_per_pos, self.cache_info, self.lora_info)
        return [family for family in vars(self).values()
                if not isinstance(family, dict) and family not in extra] + \
            list(self.kv_transfer.values())


@dataclass
class _Seen:
    """One engine's totals since it started, as last recorded: a counter adds what grew."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    kv_transfer: KVTransferStats = field(default_factory=KVTransferStats)
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)


class PrometheusMetrics:
    """A ``StatLogger`` with its own registry (so servers in one process do not clash)."""

    def __init__(self, model_name: str, num_engines: int = 1, max_model_len: int = 2048,
                 cache: CacheInfo | None = None, max_loras: int = 0) -> None:
        """``max_loras``: the engine's adapter slots (0: LoRA off, no LoRA gauge)."""
        self.registry = CollectorRegistry()
        self._max_loras = max_loras
        self._lora_labels: dict[str, tuple[str, ...]] = {}  # each engine's LoRA gauge sample
        self._families = _Families(self.registry, max_model_len)
        self._model_name = model_name
        self._cache = cache
        self._seen: dict[int, _Seen] = {}
        for engine_index in range(num_engines):  # each engine's samples exist, at 0, at once
            self._labels(engine_index)

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats,
               engine_index: int = 0) -> None:
        labels = self._labels(engine_index)
        families = self._families
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats, labels, self._seen[engine_index])
        families.preemptions.labels(**labels).inc(iteration.num_preempted_reqs)
        families.prompt_tokens.labels(**labels).inc(iteration.num_prompt_tokens)
        families.generation_tokens.labels(**labels).inc(iteration.num_generation_tokens)
        iteration_tokens = iteration.num_prompt_tokens + iteration.num_generation_tokens
        if iteration_tokens:
            families.iteration_tokens.labels(**labels).observe(iteration_tokens)
        _observe(families.ttft.labels(**labels), iteration.time_to_first_tokens)
        _observe(families.itl.labels(**labels), iteration.inter_token_latencies)
        for finished in iteration.finished_requests:
            self._record_finished(finished, labels)

    def record_stalled(self, stalled: Collection[int]) -> None:
        """Which engines (by index) are stalled now; the others are not."""
        for engine_index in self._seen:
            self._families.stalled.labels(**self._labels(engine_index)).set(
                engine_index in stalled)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _labels(self, engine_index: int) -> dict[str, str]:
        """The engine's labels; its samples are created (at 0) the first time."""
        labels = {"model_name": self._model_name, "engine": str(engine_index)}
        if engine_index not in self._seen:
            self._seen[engine_index] = _Seen()
            families = self._families
            for family in families.per_engine():
                family.labels(**labels)
            for reason in FINISH_REASONS:
                families.success.labels(**labels, finished_reason=reason)
            if self._cache is not None:
                families.cache_info.labels(
                    engine=str(engine_index), block_size=str(self._cache.block_size),
                    num_gpu_blocks=str(self._cache.num_gpu_blocks),
                    enable_prefix_caching=str(self._cache.enable_prefix_caching)).set(1)
        return labels

    def _record_loras(self, stats: SchedulerStats, engine: str) -> None:
        """The engine's one ``vllm:lora_requests_info`` sample, replaced (not added to: the
        label values change with the adapters, and old samples would pile up)."""
        gauge = self._families.lora_info
        labels = (engine, str(self._max_loras), ",".join(sorted(stats.waiting_lora_adapters)),
                  ",".join(sorted(stats.running_lora_adapters)))
        previous = self._lora_labels.get(engine)
        if previous is not None and previous != labels:
            gauge.remove(*previous)
        self._lora_labels[engine] = labels
        gauge.labels(*labels).set(time.time())

    def _record_finished(self, finished: FinishedRequestStats, labels: dict[str, str]) -> None:
        families = self._families
        for reason in finished.finish_reasons:
            families.success.labels(**labels, finished_reason=reason).inc()
        for family, value in (
                (families.e2e, finished.e2e_latency),
                (families.queue_time, finished.queued_time),
                (families.prefill_time, finished.prefill_time),
                (families.decode_time, finished.decode_time),
                (families.inference_time, finished.inference_time),
                (families.tpot, finished.time_per_output_token),
                (families.prompt_len, finished.num_prompt_tokens),
                (families.max_generation_len, max(finished.num_generation_tokens, default=0)),
                (families.n_param, len(finished.num_generation_tokens)),
                (families.max_tokens_param, finished.max_tokens_param)):
            if value is not None:
                family.labels(**labels).observe(value)
        _observe(families.generation_len.labels(**labels), finished.num_generation_tokens)

    def _record_scheduler(self, stats: SchedulerStats, labels: dict[str, str],
                          seen: _Seen) -> None:
        families = self._families
        families.running.labels(**labels).set(stats.num_running_reqs)
        families.waiting.labels(**labels).set(stats.num_waiting_reqs)
        families.kv_usage.labels(**labels).set(stats.kv_cache_usage)
        if self._max_loras:
            self._record_loras(stats, labels["engine"])
        prefix = stats.prefix_cache  # totals since the engine started
        families.prefix_hit_rate.labels(**labels).set(prefix.hit_rate)
        _add_total(families.prefix_queries.labels(**labels), prefix.queries,
                   seen.prefix_queries)
        _add_total(families.prefix_hits.labels(**labels), prefix.hits, seen.prefix_hits)
        seen.prefix_queries, seen.prefix_hits = prefix.queries, prefix.hits
        for name, counter in families.kv_transfer.items():  # totals since the engine started
            _add_total(counter.labels(**labels), getattr(stats.kv_transfer, name),
                       getattr(seen.kv_transfer, name))
        seen.kv_transfer = stats.kv_transfer
        if stats.spec_decoding is not None:  # totals since the engine started
            self._record_spec(stats.spec_decoding, labels, seen)

    def _record_spec(self, spec: SpecDecodingStats, labels: dict[str, str],
                     seen: _Seen) -> None:
        families = self._families
        new = spec.since(seen.spec)
        if new.num_drafts < 0:  # a restarted engine's totals
            new = spec
        families.spec_drafts.labels(**labels).inc(new.num_drafts)
        families.spec_draft_tokens.labels(**labels).inc(new.num_draft_tokens)
        families.spec_accepted.labels(**labels).inc(new.num_accepted_tokens)
        for position, count in enumerate(new.accepted_per_position):
            families.spec_accepted_per_pos.labels(**labels, position=str(position)).inc(count)
        seen.spec = spec


def _observe(histogram: Histogram, values: list[float] | list[int]) -> None:
    for value in values:
        histogram.observe(value)


def _add_total(counter: Counter, total: int, seen: int) -> None:
    """Count what a total since the engine started added; a total below the last one seen
    is a new engine's (restarted, ``--restart-engine``), counted from zero."""
    counter.inc(total - seen if total >= seen else total)
