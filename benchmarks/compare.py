"""Run one reference workload on Octavo, HF transformers ``generate`` (one static batch) and,
when its virtual environment is given, vLLM's CPU build - each engine in its own process, the
engines alternating run after run so a noisy machine slows them alike - and print one table
with each engine's throughput and its ratio to Octavo's.

    .venv/bin/python benchmarks/compare.py --workload W1_throughput
    .venv/bin/python benchmarks/compare.py --workload W1_throughput \\
        --vllm-python /work/vllm-venv/bin/python --repeats 3

Every engine gets the same token-id prompts (built here from workloads.json), the same
model folder and dtype, greedy decoding and exactly ``output_len`` tokens per request. A GGUF
model (the default one) is converted once to an HF folder, since HF transformers and vLLM's
CPU build run dequantized weights anyway; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from octavo.bench.workloads import build_workload, load_specs
from octavo.config import parse_memory
from octavo.entrypoints.table import format_table
from octavo.models.loader import default_model_path, load_model_files

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "engines"
ENGINES = ("octavo", "hf", "vllm")
WARMUP_PROMPT_LEN = 16
RUN_TIMEOUT_S = 3 * 60 * 60


@dataclass
class RunResult:
    engine: str
    wall_s: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=sorted(load_specs()))
    parser.add_argument("--model", default=None,
                        help="HF folder or .gguf (default: Octavo's default model)")
    parser.add_argument("--dtype", default="float32", help="for every engine")
    parser.add_argument("--kv-cache-memory", default="2GiB",
                        help="KV-cache size for Octavo and vLLM (HF grows its cache as needed)")
    parser.add_argument("--engines", default="octavo,hf,vllm",
                        help="comma-separated, from " + ",".join(ENGINES))
    parser.add_argument("--vllm-python", default=os.environ.get("OCTAVO_VLLM_PYTHON"),
                        help="python of the venv vLLM is installed in "
                             "(default: $OCTAVO_VLLM_PYTHON; vLLM is skipped without it)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per engine, alternating")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every engine (OMP_NUM_THREADS; vLLM: bound to "
                             "cores 0..N-1). Default: each engine's own choice")
    parser.add_argument("--work-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "octavo-compare",
                        help="where the job file, results and a converted model go")
    parser.add_argument("--output-json", type=Path, default=None, help="also write the table")
    return parser.parse_args()


def hf_folder(model: str | None, work_dir: Path) -> Path:
    """An HF folder every engine can load: ``model`` itself, or a GGUF exported (once) through
    Octavo's own loader, which dequantizes it - so all engines run the very weights Octavo
    runs (transformers refuses to re-save a GGUF it loaded)."""
    path = default_model_path() if model is None else Path(model)
    if path.is_dir():
        return path
    target = work_dir / f"{path.stem}-hf"
    if (target / "config.json").is_file():
        return target
    print(f"exporting {path.name} to an HF folder in {target} (once)", flush=True)
    files = load_model_files(path)
    target.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in files.iter_weights()},
              target / "model.safetensors")
    files.tokenizer.save_pretrained(target)
    (target / "config.json").write_text(json.dumps(files.hf_config, indent=2))  # last: marks done
    return target


def write_job(workload: str, model: Path, dtype: str, kv_cache_bytes: int,
              work_dir: Path) -> Path:
    spec = build_workload(workload)
    # A constant prompt: shares no cached block with the random workload prompts.
    warmup = [spec.prompts[0][-1]] * WARMUP_PROMPT_LEN
    job = {"workload": workload, "model": str(model), "dtype": dtype,
           "kv_cache_bytes": kv_cache_bytes, "prompts": spec.prompts,
           "output_len": spec.output_len, "warmup_prompt": warmup}
    path = work_dir / f"{workload}.job.json"
    path.write_text(json.dumps(job))
    return path


def engine_command(engine: str, job: dict, job_path: Path, out: Path,
                   vllm_python: str | None) -> list[str]:
    if engine == "octavo":  # the project's own CLI does the measuring
        return [sys.executable, "-m", "octavo", "bench", "throughput",
                "--workload", job["workload"], "--model", job["model"], "--dtype", job["dtype"],
                "--kv-cache-memory", str(job["kv_cache_bytes"]), "--output-json", str(out)]
    python = sys.executable if engine == "hf" else vllm_python
    runner = RUNNERS / ("hf_generate.py" if engine == "hf" else "vllm_generate.py")
    return [str(python), str(runner), "--job", str(job_path), "--output-json", str(out)]


def engine_env(engine: str, threads: int | None) -> dict[str, str]:
    """The same thread count for every engine when asked: on a CPU shared with other work,
    OpenMP threads that wait on each other can slow small ops by an order of magnitude, so
    engines that pick different counts would not be compared like for like."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
        if engine == "vllm":
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    return env


def run_engine(engine: str, command: list[str], out: Path, threads: int | None) -> RunResult:
    print(f"--- {engine}: {' '.join(command)}", flush=True)
    done = subprocess.run(command, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S,
                          env=engine_env(engine, threads))
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed with exit code {done.returncode} (output above)")
    data = json.loads(out.read_text())
    if engine == "octavo":
        return RunResult(engine, data["elapsed_time"], data["num_requests"],
                         data["prompt_tokens"], data["output_tokens"])
    return RunResult(engine, data["wall_s"], data["num_requests"], data["prompt_tokens"],
                     data["output_tokens"])


def summary(results: list[RunResult], engines: list[str]) -> tuple[list[str], list[list]]:
    """One row per engine: median wall time over its runs, throughputs from it, and output
    throughput as a ratio to Octavo's (above 1: faster than Octavo)."""
    rows = []
    octavo_tps = None
    for engine in engines:
        runs = [r for r in results if r.engine == engine]
        wall = statistics.median(r.wall_s for r in runs)
        run = runs[0]  # every run of a workload has the same token counts
        out_tps = run.output_tokens / wall
        if engine == "octavo":
            octavo_tps = out_tps
        ratio = f"{out_tps / octavo_tps:.2f}x" if octavo_tps else "-"
        rows.append([engine, len(runs), run.num_requests, f"{wall:.2f}", f"{out_tps:.1f}",
                     f"{(run.prompt_tokens + run.output_tokens) / wall:.1f}", ratio])
    headers = ["engine", "runs", "requests", "median wall s", "output tok/s", "total tok/s",
               "vs octavo"]
    return headers, rows


def main() -> None:
    args = parse_args()
    asked = {e.strip() for e in args.engines.split(",") if e.strip()}
    if asked - set(ENGINES):
        raise SystemExit(f"--engines: unknown {', '.join(sorted(asked - set(ENGINES)))}; "
                         f"choose from {','.join(ENGINES)}")
    engines = [e for e in ENGINES if e in asked]  # Octavo first: the ratios' base
    if "vllm" in engines and not args.vllm_python:
        print("vllm skipped: give --vllm-python or $OCTAVO_VLLM_PYTHON (benchmarks/README.md)")
        engines.remove("vllm")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    job_path = write_job(args.workload, hf_folder(args.model, args.work_dir), args.dtype,
                         parse_memory(args.kv_cache_memory), args.work_dir)
    job = json.loads(job_path.read_text())
    results = []
    for repeat in range(args.repeats):
        for engine in engines:
            out = args.work_dir / f"{engine}-{repeat}.json"
            command = engine_command(engine, job, job_path, out, args.vllm_python)
            results.append(run_engine(engine, command, out, args.threads))
    headers, rows = summary(results, engines)
    threads = (f"{args.threads} thread{'s' if args.threads > 1 else ''}" if args.threads
               else "each engine's default threads")
    print(f"\n{args.workload} ({job['model']}, {args.dtype}, {threads}); "
          "same prompts for every engine")
    print(format_table(headers, rows))
    if args.output_json:
        args.output_json.write_text(json.dumps(
            {"workload": args.workload, "model": job["model"], "dtype": args.dtype,
             "threads": args.threads,
             "table": [dict(zip(headers, row)) for row in rows],
             "runs": [r.__dict__ for r in results]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
