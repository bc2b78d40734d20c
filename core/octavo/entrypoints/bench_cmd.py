"""``octavo bench``: latency, throughput, online serving and auto-tuning benchmarks. Flag names
follow vLLM's ``vllm bench`` so a vLLM user's command line works unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import click

from octavo.bench.datasets import (
    DATASET_NAMES,
    BenchRequest,
    DatasetOptions,
    build_requests,
    chat_requests,
    copy_requests,
    random_requests,
    workload_requests,
)
from octavo.bench.workloads import load_specs
from octavo.entrypoints.engine_args import engine_options, pop_engine_kwargs
from octavo.entrypoints.platform_choice import resolve_platform_or_exit

WORKLOAD_OPTION = click.option(
    "--workload", type=click.Choice(sorted(load_specs())), default=None,
    help="Run a reference workload of workloads.json exactly (overrides the dataset flags).")

DATASET_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--dataset-name", default="random", show_default=True,
                 callback=lambda ctx, param, value: value.replace("_", "-"),
                 help=f"Where prompts come from: {' | '.join(DATASET_NAMES)} (vLLM's "
                      "prefix_repetition spelling works too)."),
    click.option("--dataset-path", default=None,
                 help="sharegpt: a local JSON file in the ShareGPT conversation format."),
    click.option("--num-prompts", type=int, default=100, show_default=True),
    click.option("--random-input-len", type=int, default=256, show_default=True),
    click.option("--random-output-len", type=int, default=128, show_default=True),
    click.option("--random-range-ratio", type=float, default=0.0, show_default=True,
                 help="Lengths uniform in [len*(1-r), len*(1+r)]."),
    click.option("--random-prefix-len", type=int, default=0, show_default=True,
                 help="A random prefix shared by every prompt."),
    click.option("--sharegpt-output-len", type=int, default=None,
                 help="Generate this many tokens instead of the recorded reply's length."),
    click.option("--prefix-repetition-prefix-len", type=int, default=256, show_default=True),
    click.option("--prefix-repetition-suffix-len", type=int, default=256, show_default=True),
    click.option("--prefix-repetition-num-prefixes", type=int, default=10, show_default=True),
    click.option("--prefix-repetition-output-len", type=int, default=128, show_default=True),
    WORKLOAD_OPTION,
]
DATASET_KEYS = ("dataset_name", "dataset_path", "num_prompts", "random_input_len",
                "random_output_len", "random_range_ratio", "random_prefix_len",
                "sharegpt_output_len", "prefix_repetition_prefix_len",
                "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes",
                "prefix_repetition_output_len", "workload")


def dataset_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(DATASET_OPTIONS):
        command = option(command)
    return command


def pop_dataset_options(kwargs: dict[str, Any], seed: int) -> DatasetOptions:
    return DatasetOptions(**{key: kwargs.pop(key) for key in DATASET_KEYS}, seed=seed)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Clean CLI errors instead of tracebacks: bad flag values found past click's own checks
    (datasets, rates, SLOs) exit 2 naming the flag; a model that does not load, an endpoint
    that cannot be reached or a request the engine refuses exit 1 saying so."""
    from octavo.bench.serve import EndpointError
    from octavo.config import ConfigError
    from octavo.engine.errors import InvalidRequestError
    from octavo.models.loader import ModelLoadError

    try:
        yield
    except (ModelLoadError, EndpointError) as exc:  # before ValueError: some subclass it
        raise click.ClickException(str(exc)) from None
    except InvalidRequestError as exc:
        raise click.ClickException(f"the engine refused a request: {exc}") from None
    except (ValueError, ConfigError) as exc:
        raise click.UsageError(str(exc)) from None


def make_llm(kwargs: dict[str, Any]) -> Any:
    """The offline engine from the shared engine flags."""
    from octavo.engine.llm import LLM

    engine_kwargs = pop_engine_kwargs(kwargs)
    resolve_platform_or_exit(engine_kwargs["backend"])
    return LLM(**engine_kwargs)


def settled_engine(llm: Any) -> dict[str, Any]:
    """What the engine settled at start that its flags may leave unset, for the JSON: a
    run compares with another only where these match."""
    return {"async_scheduling": llm.llm_engine.config.scheduler.async_scheduling}


def report(summary: str, output_json: str | None, data: dict[str, Any]) -> None:
    from octavo.bench.report import write_json

    click.echo(summary)
    if output_json:
        write_json(output_json, data)
        click.echo(f"results written to {output_json}")


@click.group()
def bench() -> None:
    """Benchmarks: latency, throughput, online serving, auto-tuning, the roofline sweep."""


@bench.command()
@click.option("--input-len", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--num-iters-warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--num-iters", type=click.IntRange(min=1), default=5, show_default=True,
              help="Measured iterations (a workload's 'repeats' overrides it).")
@click.option("--dataset-name", type=click.Choice(["random", "copy", "chat"]), default="random",
              show_default=True,
              help="random: --input-len random tokens; copy: chat prompts asking to repeat a "
                   "passage, generating its length (--input/--output-len unused); chat: "
                   "everyday instructions, generating --output-len tokens (--input-len "
                   "unused).")
@WORKLOAD_OPTION
@click.option("--output-json", default=None, help="Write the results here as JSON.")
@engine_options
def latency(input_len: int, output_len: int, batch_size: int, num_iters_warmup: int,
            num_iters: int, dataset_name: str, workload: str | None, output_json: str | None,
            **kwargs: Any) -> None:
    """Time one batch from submission to its last token, over repeated iterations."""
    from octavo.bench.latency import run_latency
    from octavo.bench.report import latency_table

    seed = kwargs["seed"]
    with usage_errors():
        llm = make_llm(kwargs)
        if workload is not None:
            requests = workload_requests(workload)
            num_iters = load_specs()[workload].get("repeats", num_iters)
        elif dataset_name == "copy":
            requests = copy_requests(batch_size, llm.get_tokenizer(), seed)
        elif dataset_name == "chat":
            requests = chat_requests(batch_size, output_len, llm.get_tokenizer(), seed)
        else:
            requests = random_requests(batch_size, input_len, output_len, seed=seed,
                                       vocab_size=len(llm.get_tokenizer()))
        result = run_latency(llm, requests, num_iters_warmup, num_iters)
    report(latency_table(result), output_json, {"workload": workload, **result.to_json(),
                                                **settled_engine(llm)})


@bench.command()
@click.option("--max-batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Sweep B = 1, 2, 4, ... up to this.")
@click.option("--context-len", type=click.IntRange(min=1), default=256, show_default=True,
              help="Prompt tokens of every sequence (the context the steps attend over).")
@click.option("--steps", type=click.IntRange(min=1), default=16, show_default=True,
              help="Decode steps timed in each iteration.")
@click.option("--num-iters-warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--num-iters", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--base-url", default=None,
              help="Sweep this OpenAI-compatible server (B streams at once) instead of an "
                   "engine in this process; the roofline then uses --shapes-from and this "
                   "machine's peaks.")
@click.option("--shapes-from", default=None,
              help="With --base-url: the local HF folder or .gguf whose shapes the server's "
                   "model has (default: Octavo's default model).")
@click.option("--dtype-bytes", type=click.IntRange(min=1), default=2, show_default=True,
              help="With --base-url: bytes per weight and KV element on the server (2: bf16).")
@click.option("--label", default=None, help="The engine's name in the plot and JSON.")
@click.option("--plot", default=None,
              help="Draw step time and throughput against B with the roofline (PNG).")
@click.option("--plot-with", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Draw this saved sweep (--output-json) too, e.g. another engine's.")
@click.option("--output-json", default=None, help="Write the results here as JSON.")
@engine_options
def sweep(max_batch_size: int, context_len: int, steps: int, num_iters_warmup: int,
          num_iters: int, base_url: str | None, shapes_from: str | None, dtype_bytes: int,
          label: str | None, plot: str | None, plot_with: tuple[str, ...],
          output_json: str | None, **kwargs: Any) -> None:
    """Decode step time at batch sizes 1, 2, 4, ..., beside the roofline: the bytes and
    FLOPs each step must move and do, against the machine's measured peaks."""
    from octavo.bench.report import require_matplotlib
    from octavo.bench.sweep import batch_sizes
    from octavo.bench.sweep_report import plot_sweep, sweep_table

    with usage_errors():
        if plot:
            require_matplotlib()
        sizes = batch_sizes(max_batch_size)
        earlier = [json.loads(Path(path).read_text()) for path in plot_with]
        settings = SweepSettings(sizes, context_len, steps, num_iters_warmup, num_iters,
                                 kwargs["seed"])
        settled: dict[str, Any] = {}  # a server's settings are its own
        if base_url:
            result = _server_sweep(base_url, shapes_from, dtype_bytes, settings)
        else:
            result, settled = _engine_sweep(kwargs, settings)
    if label is not None:
        result.label = label
    report(sweep_table(result), output_json, {**result.to_json(), **settled})
    if plot:
        plot_sweep(plot, [result.to_json(), *earlier])
        click.echo(f"plot written to {plot}")


class SweepSettings(NamedTuple):
    """The sweep's flags both sweeps take, in ``run_sweep``'s positional order."""
    sizes: list[int]
    context_len: int
    steps: int
    num_iters_warmup: int
    num_iters: int
    seed: int


def _engine_sweep(kwargs: dict[str, Any], settings: SweepSettings) -> tuple[Any, dict[str, Any]]:
    """The sweep of an engine in this process, and what that engine settled at start."""
    from octavo.bench.roofline import ModelShape
    from octavo.bench.sweep import run_sweep
    from octavo.plugins.resolve import resolve_platform

    llm = make_llm(kwargs)
    engine = llm.llm_engine
    shape = ModelShape.from_hf_config(engine.model_files.hf_config)
    dtype = engine.config.model.torch_dtype(
        resolve_platform(engine.config.device.backend).default_dtype)
    peaks = _peaks(shape, dtype)
    held, weights = map(sum, zip(*engine.core.executor.collective_rpc("matmul_weight_bytes")))
    weight_bytes = held / weights  # bf16: 2; quantized: the blocks' bytes per weight
    click.echo(f"weights as held: {weight_bytes:.3f} bytes per weight (the roofline's)")
    return run_sweep(llm, shape, peaks, *settings, weight_bytes=weight_bytes,
                     kv_bytes=dtype.itemsize), settled_engine(llm)


def _server_sweep(base_url: str, shapes_from: str | None, dtype_bytes: int,
                  settings: SweepSettings) -> Any:
    import torch

    from octavo.bench.roofline import ModelShape
    from octavo.bench.serve import ServeTarget, fetch_model_name
    from octavo.bench.sweep import run_server_sweep
    from octavo.models.loader import load_model_files

    files = load_model_files(shapes_from)
    shape = ModelShape.from_hf_config(files.hf_config)
    dtype = {2: torch.bfloat16, 4: torch.float32}.get(dtype_bytes, torch.bfloat16)
    peaks = _peaks(shape, dtype)
    target = ServeTarget(base_url, asyncio.run(fetch_model_name(base_url)))
    return run_server_sweep(target, shape, peaks, settings.sizes, settings.context_len,
                            settings.steps, settings.num_iters, settings.seed,
                            len(files.tokenizer), dtype_bytes, dtype_bytes)


def _peaks(shape: Any, dtype: Any) -> Any:
    """The machine's peaks, measured on a thread of their own that ends with them: an
    OpenMP pool left on this thread beside the engine's step thread (async scheduling)
    made libgomp count more threads than cores and let idle ones sleep at once, doubling
    the sweep's steps."""
    from concurrent.futures import ThreadPoolExecutor

    from octavo.bench.calibrate import measure_peaks

    click.echo("measuring this machine's peak FLOP/s and memory bandwidth ...")
    with ThreadPoolExecutor(1, thread_name_prefix="peaks") as pool:
        return pool.submit(measure_peaks, shape, dtype).result()


@bench.command()
@dataset_options
@click.option("--json-schema", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Guide every request with this JSON schema (a .json file), to measure the "
                   "overhead of guided decoding. A request also ends when its JSON is complete.")
@click.option("--output-json", default=None, help="Write the results here as JSON.")
@engine_options
def throughput(json_schema: str | None, output_json: str | None, **kwargs: Any) -> None:
    """Submit every request at once and measure requests and tokens per second."""
    from octavo.bench.report import throughput_table
    from octavo.bench.throughput import run_throughput

    options = pop_dataset_options(kwargs, kwargs["seed"])
    with usage_errors():
        options.check()
        structured = load_json_schema(json_schema) if json_schema else None
        llm = make_llm(kwargs)
        requests = build_requests(options, llm.get_tokenizer())
        result = run_throughput(llm, requests, structured)
    report(throughput_table(result), output_json,
           {"workload": options.workload, "dataset": options.dataset_name,
            "json_schema": json_schema, **result.to_json(), **settled_engine(llm)})


def load_json_schema(path: str) -> Any:
    """``--json-schema``'s file as the constraint of every request, checked before the model
    loads."""
    from octavo.sampling_params import StructuredOutputsParams
    from octavo.structured.grammar import validate

    try:
        structured = StructuredOutputsParams(json=Path(path).read_text())
        validate(structured)
        return structured
    except ValueError as exc:
        raise ValueError(f"--json-schema {path}: {exc}") from None


@bench.command("serve", context_settings={"allow_extra_args": True})
@click.option("--base-url", default=None,
              help="The server's root URL, e.g. http://127.0.0.1:8000 (overrides --host/--port).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--endpoint", default="/v1/completions", show_default=True)
@click.option("--model", default=None,
              help="Model name to request (default: the first one GET /v1/models lists).")
@click.option("--tokenizer", default=None,
              help="Local HF folder or .gguf for the tokenizer (default: --model when it is a "
                   "path, else Octavo's default model).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="Bearer token (default: $OPENAI_API_KEY).")
@dataset_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--request-rate", type=float, multiple=True,
              help="Requests per second, inf = all at once (default inf, or the workload's). "
                   "Repeat to sweep.")
@click.option("--burstiness", type=float, default=None,
              help="Shape of the Gamma gaps: 1 = Poisson, <1 burstier, >1 steadier.")
@click.option("--max-concurrency", type=int, default=None, help="Most requests in flight.")
@click.option("--ramp-up-strategy", type=click.Choice(["linear", "exponential"]), default=None,
              help="Move the rate from --ramp-up-start-rps to --ramp-up-end-rps.")
@click.option("--ramp-up-start-rps", type=float, default=None)
@click.option("--ramp-up-end-rps", type=float, default=None)
@click.option("--goodput", multiple=True, metavar="NAME:MS",
              help="SLOs for goodput, e.g. --goodput ttft:500 tpot:50 e2el:5000.")
@click.option("--metric-percentiles", default="90,99", show_default=True,
              help="Percentiles to report besides mean and median, comma-separated.")
@click.option("--save-result", default=None, help="Write the results here as JSON.")
@click.option("--plot", default=None, help="Draw latency distributions and throughput (PNG).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask for exactly the dataset's output lengths (an extension to OpenAI's "
                   "API that vLLM and Octavo accept).")
@click.option("--disable-tqdm", is_flag=True, help="No progress bar.")
@click.pass_context
def serve_bench(ctx: click.Context, **kwargs: Any) -> None:
    """Load an OpenAI-compatible server with streaming completions; report TTFT, TPOT, ITL,
    E2E latency, throughput and goodput."""
    from octavo.bench.metrics import compute_metrics, parse_percentiles, parse_slos
    from octavo.bench.report import (
        plot_serve,
        rate_label,
        require_matplotlib,
        run_label,
        serve_json,
        serve_table,
    )
    from octavo.bench.serve import ServeTarget, fetch_model_name, run_serve

    options = pop_dataset_options(kwargs, kwargs["seed"])
    with usage_errors():
        options.check()
        if kwargs["plot"]:
            require_matplotlib()
        slos = parse_slos(goodput_items(ctx, kwargs["goodput"]))
        percentiles = parse_percentiles(kwargs["metric_percentiles"])
        ramp_up = ramp_up_setting(kwargs)
        rates, burstiness = arrival_settings(options.workload, kwargs)
        if ramp_up is not None:
            rates = rates[:1]  # one run: the ramp sets the rate
        base_url = kwargs["base_url"] or f"http://{kwargs['host']}:{kwargs['port']}"
        model = kwargs["model"] or asyncio.run(fetch_model_name(base_url, kwargs["api_key"]))
        target = ServeTarget(base_url, model, kwargs["endpoint"], kwargs["api_key"],
                             kwargs["ignore_eos"])
        requests = serve_requests(options, kwargs["tokenizer"] or model)
        runs, metrics = [], []
        for rate in rates:
            what = "ramp-up" if ramp_up is not None else rate_label(rate)
            click.echo(f"{what}: {len(requests)} requests to {target.url}")
            run = run_serve(target, requests, rate, burstiness, kwargs["max_concurrency"],
                            ramp_up, options.seed, not kwargs["disable_tqdm"])
            runs.append(run)
            metrics.append(compute_metrics(run.records, run.duration_s, percentiles, slos))
    labels = [run_label(run) for run in runs]
    data = {"base_url": base_url, "endpoint": target.endpoint, "model": model,
            "workload": options.workload, "dataset": options.dataset_name, "goodput_slos": slos,
            "runs": [serve_json(run, m) for run, m in zip(runs, metrics)]}
    report(serve_table(labels, metrics, [run.requests_per_engine for run in runs]),
           kwargs["save_result"], data)
    if kwargs["plot"]:
        plot_serve(kwargs["plot"], runs)
        click.echo(f"plot written to {kwargs['plot']}")


def goodput_items(ctx: click.Context, given: tuple[str, ...]) -> list[str]:
    """vLLM writes ``--goodput ttft:MS tpot:MS``; a click option takes one value, so the
    values after the first arrive as extra arguments. Anything else extra is an error."""
    items = [part for value in given for part in value.split()]
    if ctx.args and not given:
        raise click.UsageError(f"unexpected arguments: {' '.join(ctx.args)}")
    return items + list(ctx.args)


def serve_requests(options: DatasetOptions,
                   tokenizer_source: str | None) -> list[BenchRequest]:
    """Requests for a remote server: the tokenizer (for vocabulary size and ShareGPT lengths)
    comes from a local model when one is named, else from Octavo's default model."""
    if options.workload is not None:
        return workload_requests(options.workload)
    from octavo.models.loader import load_model_files

    local = tokenizer_source is not None and Path(tokenizer_source).exists()
    source = tokenizer_source if local else None
    return build_requests(options, load_model_files(source).tokenizer)


def arrival_settings(workload: str | None, kwargs: dict[str, Any]) -> tuple[list[float], float]:
    """Request rates and burstiness: the flags, else an online workload's, else inf and 1."""
    spec = load_specs()[workload] if workload is not None else {}
    rates = list(kwargs["request_rate"]) or [float(r) for r in spec.get("request_rate", [])]
    burstiness = kwargs["burstiness"]
    if burstiness is None:
        burstiness = spec.get("burstiness", 1.0)
    return rates or [math.inf], burstiness


def ramp_up_setting(kwargs: dict[str, Any]) -> Any:
    from octavo.bench.arrival import RampUp

    strategy = kwargs["ramp_up_strategy"]
    if strategy is None:
        return None
    if kwargs["ramp_up_start_rps"] is None or kwargs["ramp_up_end_rps"] is None:
        raise click.UsageError("--ramp-up-strategy needs --ramp-up-start-rps and "
                               "--ramp-up-end-rps")
    if kwargs["request_rate"]:
        raise click.UsageError("--ramp-up-strategy replaces --request-rate; give one of them")
    return RampUp(strategy, kwargs["ramp_up_start_rps"], kwargs["ramp_up_end_rps"])


@bench.command()
@click.option("--model", default=None,
              help="Model for `octavo serve` (default: Octavo's default model).")
@click.option("--max-num-seqs", "seqs_grid", default="auto", show_default=True,
              help="Grid values, comma-separated; auto: powers of two from half to twice "
                   "the saturation batch size B_sat (of --sweep-json, else the roofline's "
                   "from this machine's measured peaks).")
@click.option("--sweep-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A saved `octavo bench sweep --output-json`: its observed B_sat (else its "
                   "predicted one) centres the auto grid.")
@click.option("--max-num-batched-tokens", "tokens_grid", default="512,2048,8192",
              show_default=True, help="Grid values, comma-separated.")
@click.option("--max-latency-ms", type=float, required=True,
              help="The limit on p99 end-to-end latency.")
@click.option("--request-rates", default="1,2,4,8,16,inf", show_default=True,
              help="Rates to try at each grid point, comma-separated.")
@click.option("--burstiness", type=float, default=1.0, show_default=True)
@click.option("--serve-args", default="",
              help="More `octavo serve` flags, quoted: e.g. '--dtype float32'.")
@dataset_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-result", default=None, help="Write the table and the best setting here.")
def autotune(model: str | None, seqs_grid: str, sweep_json: str | None, tokens_grid: str,
             max_latency_ms: float, request_rates: str, burstiness: float, serve_args: str,
             seed: int, save_result: str | None, **kwargs: Any) -> None:
    """For each max-num-seqs x max-num-batched-tokens, find the highest request rate whose
    p99 end-to-end latency stays within --max-latency-ms."""
    from octavo.bench.autotune import TuneSettings, best_point, parse_rates, to_json
    from octavo.bench.autotune import autotune as run_autotune
    from octavo.bench.report import autotune_table

    options = pop_dataset_options(kwargs, seed)
    with usage_errors():
        options.check()
        settings = TuneSettings(max_latency_ms, parse_rates(request_rates), burstiness, seed,
                                ([] if model is None else ["--model", model])
                                + shlex.split(serve_args))
        seqs = (auto_seqs_grid(model, sweep_json) if seqs_grid == "auto"
                else int_list(seqs_grid, "--max-num-seqs"))
        grid = (seqs, int_list(tokens_grid, "--max-num-batched-tokens"))
        requests = serve_requests(options, model)
        points = run_autotune(*grid, requests, settings, on_point=lambda p: click.echo(
            f"max_num_seqs={p.max_num_seqs} max_num_batched_tokens="
            f"{p.max_num_batched_tokens}: best rate "
            f"{p.best.request_rate if p.best else 'none'}"))
    best = best_point(points)
    report(autotune_table(points, best, max_latency_ms), save_result,
           to_json(points, best, settings))


def auto_seqs_grid(model: str | None, sweep_json: str | None) -> list[int]:
    """The ``--max-num-seqs`` grid around B_sat: a saved sweep's observed one (else its
    predicted one), or the roofline's for ``model`` from this machine's measured peaks."""
    from octavo.bench.autotune import seqs_grid_around

    if sweep_json is not None:
        saved = json.loads(Path(sweep_json).read_text())
        b_sat = float(saved.get("b_sat_observed") or saved["b_sat_predicted"])
        source = f"{sweep_json}"
    else:
        import torch

        from octavo.bench.roofline import ModelShape, saturation_batch
        from octavo.models.loader import load_model_files

        shape = ModelShape.from_hf_config(load_model_files(model).hf_config)
        b_sat = saturation_batch(shape, _peaks(shape, torch.bfloat16), context_len=256)
        source = "the roofline (bf16, context 256)"
    grid = seqs_grid_around(b_sat)
    click.echo(f"B_sat {b_sat:.1f} from {source}: --max-num-seqs grid {grid}")
    return grid


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected integers like 16,64, got {text!r}",
                                 param_hint=flag) from None
    if any(v < 1 for v in values):
        raise click.BadParameter(f"each value must be positive, got {text!r}", param_hint=flag)
    return values
