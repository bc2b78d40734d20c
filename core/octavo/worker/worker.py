"""``Worker``: owns one device - loads the model onto it, sizes and allocates the KV cache,
and runs the model runner for each step.

Its parts come resolved (``WorkerClasses``): the engine, or a worker process's entry,
looks the config's names up in the plugin registries; the worker imports no registry.
Platforms name their worker class by qualified name (``Platform.worker_cls``); a device's
worker subclasses this one and keeps its constructor.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.config import EngineConfig
from octavo.kv_transfer.base import KVConnectorRole
from octavo.lora.manager import install_lora
from octavo.models.build import build_model
from octavo.models.config import model_eos_token_ids
from octavo.models.kv_scales import calculate_kv_scales
from octavo.models.layers.embedding import ParallelLMHead
from octavo.models.layers.linear import LinearBase
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform
from octavo.worker.compile_warmup import warm_up_compiled
from octavo.worker.interface import WorkerClasses, WorkerInterface
from octavo.worker.kv_budget import (
    bookkeeping_blocks,
    host_kv_budget,
    less_ssm_states,
    num_kv_blocks,
    pooling_blocks,
)
from octavo.worker.kv_groups import layer_kv_specs
from octavo.worker.kv_transfer import WorkerKVTransfer
from octavo.worker.model_runner import ModelRunner
from octavo.worker.pooling_runner import PoolingModelRunner
from octavo.worker.spec_decode.verifier import SpecVerifier


class Worker(WorkerInterface):
    """The core's worker: a torch device, the portable model runner."""

    runner_class: type[ModelRunner] = ModelRunner  # device workers bring their own runner

    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 classes: WorkerClasses) -> None:
        if config.model.max_model_len is None:
            raise ValueError("the worker needs config.model.max_model_len resolved")
        self.config = config
        self.platform = platform
        self.classes = classes
        self.device = torch.device(platform.device_type)
        torch.manual_seed(config.model.seed)
        dtype = config.model.torch_dtype(platform.default_dtype)
        model = build_model(files, dtype, classes.attn_backend, device=self.device,
                            architectures=classes.architectures,
                            quantization=config.model.quantization)
        if config.cache.calculate_kv_scales:
            calculate_kv_scales(model)
        lora = (install_lora(model, config.lora, dtype, platform.lora_kernels(),
                             platform.lora_delta())
                if config.lora.enable_lora else None)
        self.compiles = config.compilation.level > 0 and not config.device.enforce_eager
        if self.compiles:
            platform.compile_model(model, config.compilation)  # -O
        else:
            platform.prepare_model(model, dtype)
        pooling = ({"pooling_type": config.pooler.pooling_type}
                   if config.model.runner == "pooling" else {})
        runner_class = PoolingModelRunner if pooling else self.runner_class
        self.runner = runner_class(
            model, classes.attn_backend,
            block_size=config.cache.block_size,
            max_num_reqs=config.scheduler.max_num_seqs,
            max_model_len=config.model.max_model_len,
            vocab_size=int(files.hf_config["vocab_size"]),
            eos_token_ids=frozenset(model_eos_token_ids(files, config.model.generation_config)),
            device=self.device,
            **pooling,
        )
        self.runner.set_kv_cache_dtype(config.cache.kv_torch_dtype(dtype))
        self.runner.lora = lora
        if config.speculative is not None:
            assert classes.proposer is not None, "speculative decoding without a proposer"
            self.runner.spec = SpecVerifier(config.speculative, self.runner, classes.proposer,
                                            platform, classes.architectures)

    def get_kv_cache_spec(self) -> list[int | str | None]:
        return layer_kv_specs(self.runner.model)

    def determine_num_blocks(self) -> int:
        """KV blocks that fit the host budget (``octavo.worker.kv_budget``), the SSM layers'
        per-request states (a slot per ``max_num_seqs``) paid from it first. The pooling
        runner needs less: an encoder, which has no KV cache, gets blocks that only count
        the step's tokens; a pooling decoder without ``--kv-cache-memory``, what its
        prompts need while they are computed (``pooling_blocks``)."""
        per_block = self.runner.kv_cache_bytes_per_block()
        if per_block == 0:
            return bookkeeping_blocks(self.config)
        if self.config.model.runner == "pooling" and self.config.cache.kv_cache_memory is None:
            return pooling_blocks(self.config)
        budget = less_ssm_states(host_kv_budget(self.config, self.platform),
                                 self.runner.ssm_state_bytes(), self.config)
        return num_kv_blocks(budget, per_block)

    def matmul_weight_bytes(self) -> tuple[int, int]:
        """(bytes, weights) of the projections and the LM head as this rank holds them -
        quantized blocks at their size: what a decode step streams per weight, for the
        roofline of ``octavo bench sweep`` on a quantized model."""
        return matmul_weight_bytes(self.runner.model)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)
        if self.compiles:
            warm_up_compiled(self.runner)
        transfer, connector_cls = self.config.kv_transfer, self.classes.kv_connector
        if transfer is not None:
            assert connector_cls is not None, "a KV transfer config without its connector"
            connector = connector_cls(transfer, KVConnectorRole.WORKER,
                                      self.config.cache.block_size)
            connector.ranks = self.runner.model.ranks
            self.runner.kv_transfer = WorkerKVTransfer(connector, self.runner.model,
                                                       self.runner.kv_caches)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)


def matmul_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes held, weights) over ``model``'s linear layers and LM head, this rank's part:
    each one's own tensors (a weight, quantized blocks, AWQ's qweight with its scales and
    zeros, a bias); a tied head counts once, as a step reads it once. Other modules (an
    MoE's experts, the embedding's rows) are left out of both sums."""
    held, weights = 0, 0
    for module in model.modules():
        if isinstance(module, LinearBase):
            weights += module.in_features * module.out_features
        elif isinstance(module, ParallelLMHead):
            weights += module.rows_per_rank * module.hidden_size
        else:
            continue
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        held += sum(tensor.nbytes for tensor in tensors)
    return held, weights
