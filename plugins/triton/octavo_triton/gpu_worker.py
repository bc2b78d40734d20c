"""``GpuWorker``: the worker of the CUDA and ROCm platforms.

On top of the core's worker it makes the platform's kernel tuning active (the platform's
``prepare_model`` switches the model's layers onto the Triton kernels), sizes the KV cache
from ``--gpu-memory-utilization`` after a profiling run (unless ``--kv-cache-memory`` gives
the size), and captures CUDA graphs for decode batches unless ``--enforce-eager``.
"""

from __future__ import annotations

import logging
import time

from octavo.plugin_api import EngineConfig, ModelFiles, Worker, WorkerClasses, num_kv_blocks
from octavo_triton.backend import TritonAttentionBackend
from octavo_triton.cuda_graphs import capture_sizes
from octavo_triton.gpu_model_runner import GpuModelRunner
from octavo_triton.gpu_platform import TritonGpuPlatform
from octavo_triton.memory_profile import (
    GIB,
    kv_cache_budget,
    measure_memory,
)
from octavo_triton.tuning import set_tuning

logger = logging.getLogger(__name__)


class GpuWorker(Worker):
    runner_class = GpuModelRunner
    runner: GpuModelRunner

    def __init__(self, config: EngineConfig, platform: type[TritonGpuPlatform],
                 files: ModelFiles, classes: WorkerClasses) -> None:
        set_tuning(platform.kernel_tuning)
        super().__init__(config, platform, files, classes)
        assert config.model.max_model_len is not None  # the core worker checked it
        self.max_model_len = config.model.max_model_len

    def determine_num_blocks(self) -> int:
        if self.config.cache.kv_cache_memory is not None:
            return super().determine_num_blocks()
        config = self.config
        profile = measure_memory(lambda: self.runner.profile_run(
            config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs,
            self.max_model_len))
        budget = kv_cache_budget(profile, config.cache.gpu_memory_utilization)
        logger.info("memory: %s; KV cache %.2f GiB (gpu_memory_utilization %.2f)",
                    profile.describe(), budget / GIB, config.cache.gpu_memory_utilization)
        return num_kv_blocks(budget, self.runner.kv_cache_bytes_per_block(),
                             flag="--gpu-memory-utilization")

    def initialize_kv_cache(self, num_blocks: int) -> None:
        super().initialize_kv_cache(num_blocks)
        if self.config.device.enforce_eager:
            logger.info("--enforce-eager: no CUDA graphs")
            return
        if self.config.parallel.pipeline_parallel_size > 1:
            # A stage sends and receives between its layers, which a graph cannot replay.
            logger.info("pipeline stage: no CUDA graphs")
            return
        if len(self.runner.kv_groups) > 1:
            # The captured graphs replay one block table; each KV group has its own.
            logger.info("%d KV groups (sliding-window layers): no CUDA graphs",
                        len(self.runner.kv_groups))
            return
        if not issubclass(self.runner.attn_backend, TritonAttentionBackend):
            # Other backends may read metadata on the host, which a graph cannot replay.
            logger.info("attention backend %r: no CUDA graphs",
                        self.runner.attn_backend.name)
            return
        sizes = capture_sizes(self.config.scheduler.max_num_seqs)
        start = time.perf_counter()
        self.runner.capture_graphs(sizes, self.max_model_len)
        logger.info("captured CUDA graphs for %d decode batch sizes (1..%d) in %.1f s",
                    len(sizes), sizes[-1], time.perf_counter() - start)
