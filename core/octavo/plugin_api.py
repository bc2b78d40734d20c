"""``octavo.plugin_api``: the one module plugins import from the core, versioned.

Every type and helper a plugin needs - to add a platform, an attention backend, a KV
connector, a proposer, a scheduler, a KV-cache manager, a scheduling policy, a model or a
CLI command - is re-exported here, and only names listed here are covered by the
compatibility promise (``PLUGIN_API_VERSION``, see ``octavo.plugins.api_version`` and
docs/plugins.md): within a major version names are only added; a name that goes keeps
working for one more minor release, with a ``DeprecationWarning`` naming its replacement.
Everything else under ``octavo`` is internal and may move in any release.

A plugin's entry-point module declares the range it is written for::

    OCTAVO_PLUGIN_API = ">=1.0,<2"

Names load lazily on first use, so a plugin that imports ``hookimpl`` and ``Registry`` at
its top level does not pull torch or the models into every process that lists plugins.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from octavo.plugins.api_version import PLUGIN_API_VERSION

if TYPE_CHECKING:  # the names, for type checkers (at run time they load lazily)
    from octavo.attention.base import AttentionBackend as AttentionBackend
    from octavo.attention.base import AttentionImpl as AttentionImpl
    from octavo.attention.base import AttentionMetadata as AttentionMetadata
    from octavo.attention.base import MLADims as MLADims
    from octavo.attention.base import MLAImpl as MLAImpl
    from octavo.attention.base import TokenTrees as TokenTrees
    from octavo.attention.torch_backend import TorchAttentionBackend as TorchAttentionBackend
    from octavo.attention.torch_backend import TorchAttentionImpl as TorchAttentionImpl
    from octavo.bench.chat_task import INSTRUCTIONS as CHAT_INSTRUCTIONS  # noqa: F401
    from octavo.block_hash import BlockHash as BlockHash
    from octavo.block_hash import update_block_hashes as update_block_hashes
    from octavo.config import ConfigError as ConfigError
    from octavo.config import EngineConfig as EngineConfig
    from octavo.config import KVTransferConfig as KVTransferConfig
    from octavo.config import SpeculativeConfig as SpeculativeConfig
    from octavo.cpu.platform import CpuPlatform as CpuPlatform
    from octavo.distributed.state import RankInfo as RankInfo
    from octavo.engine.llm import LLM as LLM
    from octavo.entrypoints.openai.reasoning_parsers import ReasoningParser as ReasoningParser
    from octavo.entrypoints.openai.tool_parsers import CallText as CallText
    from octavo.entrypoints.openai.tool_parsers import Parsed as Parsed
    from octavo.entrypoints.openai.tool_parsers import ToolParser as ToolParser
    from octavo.kv.block import KVBlock as KVBlock
    from octavo.kv.interface import KVCacheManagerInterface as KVCacheManagerInterface
    from octavo.kv.manager import KVCacheManager as KVCacheManager
    from octavo.kv_transfer.base import KVConnector as KVConnector
    from octavo.kv_transfer.base import KVConnectorRole as KVConnectorRole
    from octavo.models.base import CausalLM as CausalLM
    from octavo.models.base import IntermediateTensors as IntermediateTensors
    from octavo.models.base import PPMissingLayer as PPMissingLayer
    from octavo.models.build import build_model as build_model
    from octavo.models.config import ArchConfig as ArchConfig
    from octavo.models.config import model_eos_token_ids as model_eos_token_ids
    from octavo.models.layers.activation import SiluAndMul as SiluAndMul
    from octavo.models.layers.norm import RMSNorm as RMSNorm
    from octavo.models.layers.quantization import EmbeddingMethodBase as EmbeddingMethodBase
    from octavo.models.layers.quantization import LinearMethodBase as LinearMethodBase
    from octavo.models.layers.quantization import QuantizationConfig as QuantizationConfig
    from octavo.models.layers.quantization import (
        register_quantization_config as register_quantization_config,
    )
    from octavo.models.layers.rotary import RotaryEmbedding as RotaryEmbedding
    from octavo.models.layers.switch import switch_layers as switch_layers
    from octavo.models.layers.weights import WeightShapeError as WeightShapeError
    from octavo.models.llama import LlamaDecoderLayer as LlamaDecoderLayer
    from octavo.models.llama import LlamaForCausalLM as LlamaForCausalLM
    from octavo.models.llama import LlamaMLP as LlamaMLP
    from octavo.models.loader import ModelFiles as ModelFiles
    from octavo.models.loader import ModelLoadError as ModelLoadError
    from octavo.models.loader import load_model_files as load_model_files
    from octavo.outputs import CachedRequestData as CachedRequestData
    from octavo.outputs import KVConnectorOutput as KVConnectorOutput
    from octavo.outputs import LogprobsLists as LogprobsLists
    from octavo.outputs import ModelRunnerOutput as ModelRunnerOutput
    from octavo.outputs import NewRequestData as NewRequestData
    from octavo.outputs import SchedulerOutput as SchedulerOutput
    from octavo.paths import cache_root as cache_root
    from octavo.platforms import Availability as Availability
    from octavo.platforms import Platform as Platform
    from octavo.plugins import Registry as Registry
    from octavo.plugins import get_registries as get_registries
    from octavo.plugins import hookimpl as hookimpl
    from octavo.request import Request as Request
    from octavo.request import RequestStatus as RequestStatus
    from octavo.sampling_params import SamplingParams as SamplingParams
    from octavo.sampling_params import SamplingType as SamplingType
    from octavo.sampling_params import StructuredOutputsParams as StructuredOutputsParams
    from octavo.sched.interface import SchedulerInterface as SchedulerInterface
    from octavo.sched.policy import SchedulingPolicy as SchedulingPolicy
    from octavo.sched.scheduler import Scheduler as Scheduler
    from octavo.spec_decode.tree import DraftTree as DraftTree
    from octavo.worker.input_batch import CachedRequestState as CachedRequestState
    from octavo.worker.input_batch import InputBatch as InputBatch
    from octavo.worker.interface import WorkerClasses as WorkerClasses
    from octavo.worker.interface import WorkerInterface as WorkerInterface
    from octavo.worker.kv_budget import device_kv_budget as device_kv_budget
    from octavo.worker.kv_budget import host_kv_budget as host_kv_budget
    from octavo.worker.kv_budget import num_kv_blocks as num_kv_blocks
    from octavo.worker.model_runner import ModelRunner as ModelRunner
    from octavo.worker.spec_decode.proposer import ProposeInputs as ProposeInputs
    from octavo.worker.spec_decode.proposer import Proposer as Proposer
    from octavo.worker.spec_decode.proposer import ProposerContext as ProposerContext
    from octavo.worker.step_inputs import StepInputs as StepInputs
    from octavo.worker.worker import Worker as Worker

# Public name -> "module:attribute" it comes from.
_EXPORTS: dict[str, str] = {
    # the plugin system
    "hookimpl": "octavo.plugins:hookimpl",
    "Registry": "octavo.plugins:Registry",
    "get_registries": "octavo.plugins:get_registries",
    "ConfigError": "octavo.config:ConfigError",
    "EngineConfig": "octavo.config:EngineConfig",
    "KVTransferConfig": "octavo.config:KVTransferConfig",
    "SpeculativeConfig": "octavo.config:SpeculativeConfig",
    # platforms and workers
    "Platform": "octavo.platforms:Platform",
    "Availability": "octavo.platforms:Availability",
    "CpuPlatform": "octavo.cpu.platform:CpuPlatform",  # e.g. to answer as the CPU does
    "Worker": "octavo.worker.worker:Worker",
    "WorkerClasses": "octavo.worker.interface:WorkerClasses",
    "WorkerInterface": "octavo.worker.interface:WorkerInterface",
    "ModelRunner": "octavo.worker.model_runner:ModelRunner",
    "StepInputs": "octavo.worker.step_inputs:StepInputs",
    # how many KV blocks a worker allocates (octavo.worker.kv_budget)
    "host_kv_budget": "octavo.worker.kv_budget:host_kv_budget",
    "device_kv_budget": "octavo.worker.kv_budget:device_kv_budget",
    "num_kv_blocks": "octavo.worker.kv_budget:num_kv_blocks",
    # the persistent batch, for runners not built on ModelRunner (the JAX one)
    "InputBatch": "octavo.worker.input_batch:InputBatch",
    "CachedRequestState": "octavo.worker.input_batch:CachedRequestState",
    "cache_root": "octavo.paths:cache_root",  # the user cache folder (compilation caches)
    # attention
    "AttentionBackend": "octavo.attention.base:AttentionBackend",
    "AttentionImpl": "octavo.attention.base:AttentionImpl",
    "AttentionMetadata": "octavo.attention.base:AttentionMetadata",
    "TokenTrees": "octavo.attention.base:TokenTrees",
    "MLAImpl": "octavo.attention.base:MLAImpl",  # a backend's latent attention (DeepSeek)
    "MLADims": "octavo.attention.base:MLADims",
    "TorchAttentionBackend": "octavo.attention.torch_backend:TorchAttentionBackend",
    "TorchAttentionImpl": "octavo.attention.torch_backend:TorchAttentionImpl",
    # models
    "CausalLM": "octavo.models.base:CausalLM",
    "IntermediateTensors": "octavo.models.base:IntermediateTensors",
    "PPMissingLayer": "octavo.models.base:PPMissingLayer",
    "RankInfo": "octavo.distributed.state:RankInfo",
    "ArchConfig": "octavo.models.config:ArchConfig",
    "build_model": "octavo.models.build:build_model",
    "model_eos_token_ids": "octavo.models.config:model_eos_token_ids",  # what ends requests
    "ModelFiles": "octavo.models.loader:ModelFiles",
    "ModelLoadError": "octavo.models.loader:ModelLoadError",
    "load_model_files": "octavo.models.loader:load_model_files",
    "WeightShapeError": "octavo.models.layers.weights:WeightShapeError",
    "switch_layers": "octavo.models.layers.switch:switch_layers",
    "RMSNorm": "octavo.models.layers.norm:RMSNorm",
    # quantization methods (--quantization): a config class and the methods it hands layers
    "QuantizationConfig": "octavo.models.layers.quantization:QuantizationConfig",
    "LinearMethodBase": "octavo.models.layers.quantization:LinearMethodBase",
    "EmbeddingMethodBase": "octavo.models.layers.quantization:EmbeddingMethodBase",
    "register_quantization_config":
        "octavo.models.layers.quantization:register_quantization_config",
    "RotaryEmbedding": "octavo.models.layers.rotary:RotaryEmbedding",
    "SiluAndMul": "octavo.models.layers.activation:SiluAndMul",
    "LlamaDecoderLayer": "octavo.models.llama:LlamaDecoderLayer",
    "LlamaForCausalLM": "octavo.models.llama:LlamaForCausalLM",
    "LlamaMLP": "octavo.models.llama:LlamaMLP",
    # scheduling and the KV cache
    "Request": "octavo.request:Request",
    "RequestStatus": "octavo.request:RequestStatus",
    "SchedulerOutput": "octavo.outputs:SchedulerOutput",
    "NewRequestData": "octavo.outputs:NewRequestData",
    "CachedRequestData": "octavo.outputs:CachedRequestData",
    "ModelRunnerOutput": "octavo.outputs:ModelRunnerOutput",
    "KVConnectorOutput": "octavo.outputs:KVConnectorOutput",
    "LogprobsLists": "octavo.outputs:LogprobsLists",
    "SchedulerInterface": "octavo.sched.interface:SchedulerInterface",
    "Scheduler": "octavo.sched.scheduler:Scheduler",
    "SchedulingPolicy": "octavo.sched.policy:SchedulingPolicy",
    "KVCacheManagerInterface": "octavo.kv.interface:KVCacheManagerInterface",
    "KVCacheManager": "octavo.kv.manager:KVCacheManager",
    "KVBlock": "octavo.kv.block:KVBlock",
    "BlockHash": "octavo.block_hash:BlockHash",
    "update_block_hashes": "octavo.block_hash:update_block_hashes",
    # KV connectors
    "KVConnector": "octavo.kv_transfer.base:KVConnector",
    "KVConnectorRole": "octavo.kv_transfer.base:KVConnectorRole",
    # speculative decoding
    "Proposer": "octavo.worker.spec_decode.proposer:Proposer",
    "ProposerContext": "octavo.worker.spec_decode.proposer:ProposerContext",
    "ProposeInputs": "octavo.worker.spec_decode.proposer:ProposeInputs",
    "DraftTree": "octavo.spec_decode.tree:DraftTree",
    # the OpenAI server's tool-call and reasoning parsers
    "ToolParser": "octavo.entrypoints.openai.tool_parsers:ToolParser",
    "CallText": "octavo.entrypoints.openai.tool_parsers:CallText",
    "Parsed": "octavo.entrypoints.openai.tool_parsers:Parsed",
    "ReasoningParser": "octavo.entrypoints.openai.reasoning_parsers:ReasoningParser",
    # the offline API, for plugins that drive an engine (training, benchmarks)
    "LLM": "octavo.engine.llm:LLM",
    "SamplingParams": "octavo.sampling_params:SamplingParams",
    "SamplingType": "octavo.sampling_params:SamplingType",
    "StructuredOutputsParams": "octavo.sampling_params:StructuredOutputsParams",
    "CHAT_INSTRUCTIONS": "octavo.bench.chat_task:INSTRUCTIONS",
}

# Old public name -> ("module:attribute" it still resolves to, what to use instead, the plugin
# API release that removes it). 1.4 took internals out of the promise (docs/plugins.md).
_DEPRECATED: dict[str, tuple[str, str, str]] = {
    "LlamaAttention": ("octavo.models.llama:LlamaAttention",
                       "LlamaDecoderLayer.build(config, attn_backend).self_attn", "1.5"),
    "QKVParallelLinear": ("octavo.models.layers.linear:QKVParallelLinear",
                          "LlamaDecoderLayer.build(config, attn_backend, input_size=N)", "1.5"),
    "build_step": ("octavo.worker.step_inputs:StepInputs.for_tokens",
                   "StepInputs.for_tokens", "1.5"),
    "accepted_step": ("octavo.worker.spec_decode.proposer:ProposeInputs.accepted_step",
                      "ProposeInputs.accepted_step", "1.5"),
    "gather_logprobs": ("octavo.sample.logprobs:gather_logprobs",
                        "nothing (an internal of the core's sampler)", "1.5"),
}

__all__ = ["PLUGIN_API_VERSION", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        target, instead, removed_in = _DEPRECATED[name]
        warnings.warn(f"octavo.plugin_api.{name} is deprecated and goes in plugin API "
                      f"{removed_in}; use {instead}", DeprecationWarning, stacklevel=2)
        return _resolve(target)  # not cached: every access warns
    exported = _EXPORTS.get(name)
    if exported is None:
        raise AttributeError(f"module 'octavo.plugin_api' has no attribute {name!r} (plugin "
                             f"API {PLUGIN_API_VERSION}; see docs/plugins.md)")
    value = _resolve(exported)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def _resolve(target: str) -> Any:
    """The object ``"module:attribute[.attribute]"`` names."""
    module_name, _, path = target.partition(":")
    value: Any = importlib.import_module(module_name)
    for attr in path.split("."):
        value = getattr(value, attr)
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
