"""``Worker``: owns one device - loads the model onto it, sizes and allocates the KV cache,
and runs the model runner for each step."""

from __future__ import annotations

import torch

from octavo.config import EngineConfig
from octavo.kv_transfer.base import KVConnectorRole
from octavo.kv_transfer.factory import make_connector
from octavo.kv_transfer.worker_side import WorkerKVTransfer
from octavo.models.build import build_model
from octavo.models.config import eos_token_ids
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.worker.model_runner import ModelRunner

# The CPU default KV budget. The cache is allocated untouched (no memory until a block is
# written), but a long-running server does come to touch all of it: with prefix caching a
# freed block stays cached and the free queue hands out never-used blocks before evicting
# one, so the whole budget becomes resident. It is therefore sized to be resident: 1 GiB
# holds 46k tokens of SmolLM2-135M in bf16 (23k in fp32), and a server on it stays near
# 2 GB. vLLM's CPU default is 4 GiB (--kv-cache-memory 4GiB) for larger models.
CPU_DEFAULT_KV_BYTES = 1 * 2**30
CPU_DEFAULT_KV_FRACTION = 0.4  # of the RAM available at start-up


class Worker:
    runner_class: type[ModelRunner] = ModelRunner  # device workers bring their own runner

    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 max_model_len: int) -> None:
        self.config = config
        self.platform = platform
        self.device = torch.device(platform.device_type)
        torch.manual_seed(config.model.seed)
        dtype = config.model.torch_dtype(platform.default_dtype)
        backend_name = config.attention_backend or platform.attention_backend
        attn_backend = get_registries().attention_backends.get(backend_name)
        model = build_model(files, dtype, attn_backend, device=self.device)
        self.runner = self.runner_class(
            model, attn_backend,
            block_size=config.cache.block_size,
            max_num_reqs=config.max_num_seqs,
            max_model_len=max_model_len,
            vocab_size=int(files.hf_config["vocab_size"]),
            eos_token_ids=frozenset(eos_token_ids(files.hf_config)),
            device=self.device,
            speculative_config=config.speculative_config,
        )

    def determine_num_blocks(self) -> int:
        """KV blocks that fit the budget: ``--kv-cache-memory`` when given, else (on the CPU)
        the smaller of 1 GiB and 40% of the available RAM."""
        budget = self.config.cache.kv_cache_memory
        if budget is None:
            budget = min(CPU_DEFAULT_KV_BYTES,
                         int(self.platform.free_memory() * CPU_DEFAULT_KV_FRACTION))
        per_block = self.runner.kv_cache_bytes_per_block()
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"a KV budget of {budget} bytes holds no block of {per_block} bytes; "
                             "raise --kv-cache-memory")
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)
        connector = make_connector(self.config.kv_transfer, KVConnectorRole.WORKER,
                                   self.config.cache.block_size)
        if connector is not None:
            self.runner.kv_transfer = WorkerKVTransfer(connector, self.runner.model,
                                                       self.runner.kv_caches)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)
