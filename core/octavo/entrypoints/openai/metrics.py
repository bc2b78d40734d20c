"""``/metrics``: the server's Prometheus metrics (vLLM's set, under ``octavo:`` names).

Every sample carries the labels ``model_name`` and ``engine`` (the data-parallel rank of the
engine it describes, as vLLM's do), so a server with several engines shows each one's
waiting and running requests and KV usage; sum over ``engine`` for the server's.

Gauges follow the scheduler's state as each engine core reports it after each step (and
after aborts, when no step follows); counters and latency histograms are fed from what
the API process sees of each batch of outputs (``IterationStats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
LABELS = ("model_name", "engine")
KV_TRANSFER_COUNTERS = (
    ("loads", "Requests whose prompt KV a KV connector loaded."),
    ("loaded_tokens", "Prompt tokens loaded by a KV connector, not computed."),
    ("failed_loads", "KV loads that failed (those prompts were computed)."),
    ("saves", "Requests whose prompt KV a KV connector saved."))


class _Families:
    """The metric families, registered once; each engine gets its labelled children."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=registry)

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
        self.kv_transfer = {name: counter(f"octavo:kv_transfer_{name}", doc)
                            for name, doc in KV_TRANSFER_COUNTERS}
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
            [*LABELS, "position"], registry=registry)


@dataclass
class _Seen:
    """One engine's totals since it started, as last recorded: a counter adds what grew."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    kv_transfer: KVTransferStats = field(default_factory=KVTransferStats)
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)


class PrometheusMetrics:
    """A ``StatLogger`` with its own registry (so servers in one process do not clash)."""

    def __init__(self, model_name: str, num_engines: int = 1) -> None:
        self.registry = CollectorRegistry()
        self._families = _Families(self.registry)
        self._model_name = model_name
        self._seen: dict[int, _Seen] = {}
        for engine_index in range(num_engines):  # each engine's samples exist, at 0, at once
            self._labels(engine_index)

    def record(self, scheduler_stats: SchedulerStats | None, iteration: IterationStats,
               engine_index: int = 0) -> None:
        labels = self._labels(engine_index)
        families = self._families
        if scheduler_stats is not None:
            self._record_scheduler(scheduler_stats, labels, self._seen[engine_index])
        families.prompt_tokens.labels(**labels).inc(iteration.num_prompt_tokens)
        families.generation_tokens.labels(**labels).inc(iteration.num_generation_tokens)
        for histogram, values in ((families.ttft, iteration.time_to_first_tokens),
                                  (families.itl, iteration.inter_token_latencies),
                                  (families.e2e, iteration.e2e_latencies)):
            child = histogram.labels(**labels)
            for value in values:
                child.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _labels(self, engine_index: int) -> dict[str, str]:
        """The engine's labels; its samples are created (at 0) the first time."""
        labels = {"model_name": self._model_name, "engine": str(engine_index)}
        if engine_index not in self._seen:
            self._seen[engine_index] = _Seen()
            for family in vars(self._families).values():
                for metric in (family.values() if isinstance(family, dict) else [family]):
                    if metric is not self._families.spec_accepted_per_pos:
                        metric.labels(**labels)
        return labels

    def _record_scheduler(self, stats: SchedulerStats, labels: dict[str, str],
                          seen: _Seen) -> None:
        families = self._families
        families.running.labels(**labels).set(stats.num_running_reqs)
        families.waiting.labels(**labels).set(stats.num_waiting_reqs)
        families.kv_usage.labels(**labels).set(stats.kv_cache_usage)
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


def _add_total(counter: Counter, total: int, seen: int) -> None:
    """Count what a total since the engine started added; a total below the last one seen
    is a new engine's (restarted, ``--restart-engine``), counted from zero."""
    counter.inc(total - seen if total >= seen else total)
