"""``TpuWorker``: the engine's worker for the TPU platform, written in JAX.

It implements the core's ``WorkerInterface`` without the torch ``Worker``: the core's
loaders build the torch model once (HF folder or GGUF), its weights become jax arrays on
the device mesh, and each step runs the jitted JAX step (``runner.TpuModelRunner``). With
``-tp N`` this one worker holds all N devices (the platform is a single controller).
Before the engine reports ready the worker compiles every step bucket, with JAX's
persistent compilation cache under the user cache folder, so a restart reuses them.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import torch

from octavo.plugin_api import (
    EngineConfig,
    LlamaForCausalLM,
    ModelFiles,
    ModelRunnerOutput,
    Platform,
    RotaryEmbedding,
    SchedulerOutput,
    WorkerClasses,
    WorkerInterface,
    build_model,
    cache_root,
    device_kv_budget,
    host_kv_budget,
    model_eos_token_ids,
    num_kv_blocks,
)
from octavo_tpu import platform as tpu_platform
from octavo_tpu.kernels import ragged_paged_attention, write_kv
from octavo_tpu.mesh import Placement
from octavo_tpu.model import params_from_torch, spec_from_torch
from octavo_tpu.runner import TpuModelRunner

logger = logging.getLogger("octavo.tpu")

# Interpret mode keeps the KV cache in RAM: the CPU worker's default budget.


def enable_compilation_cache() -> str:
    """Turn on JAX's persistent compilation cache in the user cache folder."""
    directory = str(cache_root() / "jax")
    jax.config.update("jax_compilation_cache_dir", directory)
    return directory


class TpuWorker(WorkerInterface):
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 classes: WorkerClasses) -> None:
        if config.model.max_model_len is None:
            raise ValueError("the worker needs config.model.max_model_len resolved")
        refuse_unsupported(config)
        self.config = config
        self.platform = platform
        logger.info("tpu: persistent compilation cache in %s", enable_compilation_cache())
        torch_dtype = config.model.torch_dtype(platform.default_dtype)
        dtype = jnp.dtype(str(torch_dtype).removeprefix("torch."))
        model = build_model(files, torch.float32, classes.attn_backend,
                            architectures=classes.architectures)
        # Latent attention (DeepSeek) and Mamba layers (Jamba) are Llama subclasses too.
        other_layers = model.config.mla is not None or model.config.mamba is not None
        if not isinstance(model, LlamaForCausalLM) or model.config.num_experts or other_layers:
            raise ValueError(f"the tpu backend runs the Llama family (Llama, Mistral, Qwen2, "
                             f"Qwen3); {type(model).__name__} is not built for it yet")
        if type(model.rotary_emb) is not RotaryEmbedding:  # it reads inv_freq only
            raise ValueError(f"the tpu backend computes plain RoPE; {type(model).__name__}'s "
                             f"{model.config.rope.rope_type} RoPE (partial rotary factor "
                             f"{model.config.rope.partial_rotary_factor}) is not built for it")
        spec = spec_from_torch(model)
        placement = self._placement(config.parallel.tensor_parallel_size)
        placement.check_model(spec.num_heads, spec.num_kv_heads, model.config.intermediate_size)
        params = params_from_torch(model, spec, dtype)
        del model
        scheduler = config.scheduler
        self.runner = TpuModelRunner(
            spec, params, placement, block_size=config.cache.block_size,
            max_num_reqs=scheduler.max_num_seqs, max_model_len=config.model.max_model_len,
            max_num_batched_tokens=scheduler.max_num_batched_tokens, dtype=dtype,
            eos_token_ids=frozenset(model_eos_token_ids(files, config.model.generation_config)))

    @staticmethod
    def _placement(tp: int) -> Placement:
        found = tpu_platform.devices()
        if tp > len(found):
            hint = (" (on the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
                    "before JAX starts makes N)" if tpu_platform.INTERPRET else "")
            raise ValueError(f"tensor_parallel_size={tp} needs {tp} devices; JAX sees "
                             f"{len(found)}{hint}")
        logger.info("tpu: Pallas ragged paged attention on %d %s device(s)%s", tp,
                    found[0].platform, ", interpret mode" if tpu_platform.INTERPRET else "")
        return Placement(found[:tp], ragged_paged_attention, write_kv,
                         tpu_platform.interpret_params())

    def get_kv_cache_spec(self) -> list[int | str | None]:
        """One KV group of full-attention blocks (the interface's default): the attention
        kernel masks each layer's sliding window, and the engine keeps every block (the
        torch worker's per-window groups, which free blocks out of the window, are not
        built here)."""
        return []

    def determine_num_blocks(self) -> int:
        """KV blocks that fit ``--kv-cache-memory``; by default, in interpret mode the
        CPU worker's budget, on a TPU ``--gpu-memory-utilization`` of its memory less
        what is in use (the weights)."""
        budget = (host_kv_budget if tpu_platform.INTERPRET else device_kv_budget)(
            self.config, self.platform)
        return num_kv_blocks(budget, self.runner.kv_cache_bytes_per_block())

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the caches, then compile every step bucket before the engine serves."""
        self.runner.initialize_kv_cache(num_blocks)
        self.runner.warm_up()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)


def refuse_unsupported(config: EngineConfig) -> None:
    """Name the engine features this worker does not run (rather than ignoring them)."""
    problems = [what for what, on in (
        ("speculative decoding", config.speculative is not None),
        ("KV transfer", config.kv_transfer is not None),
        ("pipeline parallelism", config.parallel.pipeline_parallel_size > 1),
    ) if on]
    if problems:
        raise ValueError(f"the tpu backend does not run {', '.join(problems)} yet")
