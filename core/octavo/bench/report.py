"""What the benchmarks hand back to people: summary tables (``entrypoints/table.py``), JSON
files, and the serving plot (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from octavo.bench.autotune import GridPoint
from octavo.bench.latency import LatencyResult
from octavo.bench.metrics import Distribution, ServeMetrics, concurrency_steps
from octavo.bench.serve import ServeRun
from octavo.bench.throughput import ThroughputResult
from octavo.entrypoints.table import format_table

LATENCY_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2E"}
THROUGHPUT_BINS = 40


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON; an infinite request rate becomes the string "inf"
    (JSON has no infinity)."""
    Path(path).write_text(json.dumps(_finite(data), indent=2) + "\n")


def latency_table(result: LatencyResult) -> str:
    rows = [["avg latency (s)", f"{result.avg_latency:.4f}"]]
    rows += [[f"p{p} latency (s)", f"{v:.4f}"] for p, v in result.percentiles().items()]
    rows += [["avg time to first token (s)", f"{np.mean(result.ttfts):.4f}"],
             ["avg decode tokens/s", f"{np.mean(result.decode_tok_per_s):.1f}"]]
    spec = result.spec_decoding
    if spec is not None:
        rows += [["spec: acceptance rate", f"{spec.acceptance_rate:.1%}"],
                 ["spec: mean accepted length", f"{spec.mean_acceptance_length:.2f}"],
                 ["spec: per-position acceptance",
                  " ".join(f"{r:.2f}" for r in spec.position_rates())]]
    title = (f"batch {result.batch_size}, input {result.input_len}, output {result.output_len}, "
             f"{len(result.latencies)} iterations")
    return title + "\n" + format_table(["metric", "value"], rows)


def throughput_table(result: ThroughputResult) -> str:
    rows: list[list[object]] = [
        ["requests", result.num_requests],
        ["prompt / output tokens", f"{result.prompt_tokens} / {result.output_tokens}"],
        ["elapsed (s)", f"{result.elapsed_time:.2f}"],
        ["requests/s", f"{result.requests_per_second:.2f}"],
        ["output tokens/s", f"{result.output_tokens_per_second:.1f}"],
        ["total tokens/s", f"{result.tokens_per_second:.1f}"],
        ["prefix cache hit rate", f"{result.prefix_cache_hit_rate:.1%}"],
    ]
    return format_table(["metric", "value"], rows)


def serve_table(labels: list[str], metrics: list[ServeMetrics],
                requests_per_engine: list[dict[str, int] | None] | None = None) -> str:
    """One column per run (e.g. per request rate), one row per figure; with per-engine
    counts (a data-parallel server's /metrics), a row of them."""
    rows: list[list[Any]] = []

    def row(name: str, values: list[Any]) -> None:
        rows.append([name, *values])

    row("successful requests", [m.completed for m in metrics])
    row("failed requests", [m.failed for m in metrics])
    row("duration (s)", [f"{m.duration_s:.2f}" for m in metrics])
    row("total input / output tokens",
        [f"{m.total_input_tokens} / {m.total_output_tokens}" for m in metrics])
    row("request throughput (req/s)", [f"{m.request_throughput:.2f}" for m in metrics])
    row("output token throughput (tok/s)", [f"{m.output_throughput:.1f}" for m in metrics])
    row("total token throughput (tok/s)", [f"{m.total_token_throughput:.1f}" for m in metrics])
    if metrics[0].goodput is not None:
        row("goodput (req/s)", [f"{m.goodput:.2f}" for m in metrics])
    row("peak concurrency", [m.peak_concurrency for m in metrics])
    if requests_per_engine and any(requests_per_engine):
        row("requests per engine", [", ".join(f"{e}: {n}" for e, n in counts.items())
                                    if counts else "-" for counts in requests_per_engine])
    percentiles = list(metrics[0].ttft_ms.percentiles)
    columns = " / ".join(["mean", "median", *(f"p{p:g}" for p in percentiles)])
    for key, name in LATENCY_NAMES.items():
        dists: list[Distribution] = [getattr(m, key) for m in metrics]
        row(f"{name} ms ({columns})", [" / ".join(
            f"{v:.1f}" for v in (d.mean, d.median, *d.percentiles.values())) for d in dists])
    return format_table(["metric", *labels], rows)


def autotune_table(points: list[GridPoint], best: GridPoint | None,
                   max_latency_ms: float) -> str:
    """One row per grid point with the best rate it sustained, then the verdict."""
    rows = []
    for point in points:
        best_trial = point.best
        cells = ["none", "-", "-", "-"] if best_trial is None else [
            rate_label(best_trial.request_rate), f"{best_trial.request_throughput:.2f}",
            f"{best_trial.output_throughput:.1f}", f"{best_trial.p99_e2el_ms:.0f}"]
        rows.append([point.max_num_seqs, point.max_num_batched_tokens, *cells])
    table = format_table(["max_num_seqs", "max_num_batched_tokens", "best", "req/s",
                          "output tok/s", "p99 E2E ms"], rows)
    verdict = (f"best: --max-num-seqs {best.max_num_seqs} --max-num-batched-tokens "
               f"{best.max_num_batched_tokens}" if best is not None else
               f"no setting met p99 E2E <= {max_latency_ms:g} ms at any rate tried")
    return f"{table}\n{verdict}"


def serve_json(run: ServeRun, metrics: ServeMetrics) -> dict[str, Any]:
    """A run's setting, its metrics, and every request's numbers (vLLM's per-request keys:
    ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``)."""
    records = run.records
    return {"request_rate": run.request_rate, "burstiness": run.burstiness,
            "max_concurrency": run.max_concurrency,
            "ramp_up": asdict(run.ramp_up) if run.ramp_up else None, "metrics": asdict(metrics),
            "input_lens": [r.prompt_len for r in records],
            "output_lens": [r.output_len for r in records],
            "start_times": [r.start for r in records],
            "ttfts": [r.ttft for r in records], "itls": [r.itl for r in records],
            "e2els": [r.latency for r in records], "errors": [r.error for r in records],
            "requests_per_engine": run.requests_per_engine}


def rate_label(rate: float) -> str:
    return "rate inf" if math.isinf(rate) else f"rate {rate:g}"


def run_label(run: ServeRun) -> str:
    if run.ramp_up is not None:
        return f"ramp-up {run.ramp_up.start_rps:g}-{run.ramp_up.end_rps:g}"
    return rate_label(run.request_rate)


def require_matplotlib() -> None:
    """Checked before a run, not after it: a long benchmark must not end in an import error."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'octavo[bench]'")


def plot_serve(path: str | Path, runs: list[ServeRun]) -> None:
    """Latency distributions (TTFT, TPOT, ITL, E2E) and output-token throughput over time,
    one colour per run, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display here
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [("TTFT", lambda r: [r.ttft]), ("TPOT", lambda r: [r.tpot] if r.output_len > 1
                                             else []),
              ("ITL", lambda r: r.itl), ("E2E latency", lambda r: [r.latency])]
    for ax, (name, values_of) in zip(axes.flat, panels):
        for run in runs:
            ms = [v * 1000 for r in run.records if r.success for v in values_of(r)]
            ax.hist(ms, bins=40, alpha=0.6, label=run_label(run))
        ax.set(title=f"{name} distribution", xlabel="ms", ylabel="count")
    ax_tput, ax_conc = axes.flat[4], axes.flat[5]
    for run in runs:
        times = [t for r in run.records if r.success for t in r.token_times()]
        width = max(run.duration_s, 1e-3) / THROUGHPUT_BINS
        counts, edges = np.histogram(times, bins=THROUGHPUT_BINS, range=(0.0, run.duration_s))
        ax_tput.plot(edges[:-1] + width / 2, counts / width, label=run_label(run))
        steps = concurrency_steps([r for r in run.records if r.success])
        ax_conc.step([0.0] + [t for t, _ in steps], [0] + [c for _, c in steps], where="post",
                     label=run_label(run))
    ax_tput.set(title="output throughput over time", xlabel="s",
                ylabel="streamed chunks/s (~tokens/s)")
    ax_conc.set(title="requests in flight", xlabel="s", ylabel="requests")
    for ax in axes.flat:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _finite(data: Any) -> Any:
    if isinstance(data, float) and math.isinf(data):
        return "inf"
    if isinstance(data, dict):
        return {str(k): _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data
