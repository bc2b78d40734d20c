"""``octavo bench sweep``'s table and plot: the measured points beside the roofline."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from octavo.bench.roofline import ModelShape, Peaks, decode_step_cost, predict
from octavo.bench.sweep import SweepResult
from octavo.entrypoints.table import format_table


def sweep_table(result: SweepResult) -> str:
    """One row per batch size, then the peaks and both B_sat."""
    rows = [[p.batch_size, f"{p.step_s * 1000:.2f}", f"{p.tokens_per_s:.1f}",
             f"{p.bytes_per_s / 1e9:.1f}", f"{p.flops_per_s / 1e9:.1f}",
             f"{p.predicted.step_s * 1000:.2f} ({p.predicted.bound})",
             f"{p.over_bound:.2f}x"] for p in result.points]
    table = format_table(["batch", "step (ITL) ms", "output tok/s", "GB/s", "GFLOP/s",
                          "roofline ms (bound)", "measured / roofline"], rows)
    observed = result.b_sat_observed
    return "\n".join([
        table,
        f"peaks (measured): {result.peaks.flops_per_s / 1e9:.1f} GFLOP/s, "
        f"{result.peaks.bytes_per_s / 1e9:.1f} GB/s; context {result.context_len} tokens "
        f"+ {result.steps} steps; weights {result.weight_bytes:.3f} bytes each",
        f"B_sat predicted: {result.b_sat_predicted:.1f}; observed: "
        + (f"the step leaves its floor (>= 1.5x the B=1 step) at B = {observed}"
           if observed is not None else "the step stays within 1.5x the B=1 step")])


def plot_sweep(path: str | Path, sweeps: list[dict[str, Any]]) -> None:
    """Step time and throughput against B on log axes: the roofline's two regimes (of the
    first sweep's model and peaks) as lines, B_sat marked, each sweep's measured points on
    top (sweeps as ``SweepResult.to_json`` gives them, e.g. Octavo's and vLLM's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = sweeps[0]
    shape, peaks = ModelShape(**first["shape"]), Peaks(**first["peaks"])
    largest = max(p["batch_size"] for sweep in sweeps for p in sweep["points"])
    # The roofline as a smooth line: four points an octave, from 1 to the largest B.
    grid = [2 ** (i / 4) for i in range(int(4 * math.log2(largest)) + 1)] or [1.0]
    context = first["context_len"] + first["steps"] // 2
    predicted = [predict(decode_step_cost(shape, b, context), peaks)  # type: ignore[arg-type]
                 for b in grid]
    fig, (ax_itl, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    # Fixed colours, so that each engine has the same one in both panels.
    ax_itl.plot(grid, [q.memory_s * 1000 for q in predicted], "--", color="C0",
                label="memory bound")
    ax_itl.plot(grid, [q.compute_s * 1000 for q in predicted], ":", color="C1",
                label="compute bound")
    ax_tput.plot(grid, [b / q.step_s for b, q in zip(grid, predicted)], "--", color="C0",
                 label="roofline")
    for index, sweep in enumerate(sweeps):
        sizes = [p["batch_size"] for p in sweep["points"]]
        style = {"color": f"C{index + 2}", "label": f"{sweep['label']}, measured"}
        ax_itl.plot(sizes, [p["step_s"] * 1000 for p in sweep["points"]], "o-", **style)
        ax_tput.plot(sizes, [p["tokens_per_s"] for p in sweep["points"]], "o-", **style)
    b_sat = float(first["b_sat_predicted"])  # "inf" in JSON when there is none
    for ax in (ax_itl, ax_tput):
        if math.isfinite(b_sat):
            ax.axvline(b_sat, color="grey", alpha=0.5, label=f"B_sat = {b_sat:.1f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.legend(fontsize="small")
    ax_itl.set(title=f"decode step time (ITL), context {first['context_len']}", ylabel="ms")
    ax_tput.set(title="output throughput", ylabel="tokens/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
