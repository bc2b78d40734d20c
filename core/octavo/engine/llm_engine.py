"""``LLMEngine``: the in-process engine - processor, engine core and output processor
wired together. ``LLM`` (offline) drives it; the online server uses the same parts with
the core in its own process."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from octavo.config import ConfigError, EngineConfig, PoolerConfig
from octavo.engine.core import EngineCore
from octavo.engine.lora_requests import lora_ref, lora_registry
from octavo.engine.output_processor import OutputProcessor
from octavo.engine.outputs import EmbeddingRequestOutput, RequestOutput
from octavo.engine.processor import Processor, PromptType
from octavo.lora_request import LoRARequest
from octavo.models.config import eos_token_ids
from octavo.models.config_rope import context_length
from octavo.models.generation_config import (
    GenerationConfig,
    log_sampling_defaults,
    read_generation_config,
)
from octavo.models.loader import ModelFiles, load_model_files
from octavo.models.sentence_transformers import folder_max_seq_length
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.plugins.resolve import check_names, resolve_platform
from octavo.pooling_params import PoolingParams
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, files: ModelFiles) -> int:
    """The context length: the model's own (``context_length``) unless the user asks for
    less. A sentence-transformers folder's ``max_seq_length`` caps it (as in vLLM): its model
    was trained to that length, and sentence-transformers truncates there."""
    limits = {"context (max_position_embeddings, stretched by its RoPE scaling where that "
              "extends it)": context_length(files.hf_config)}
    if files.source.is_dir() and (seq_len := folder_max_seq_length(files.source)):
        limits["sentence_bert_config.json's max_seq_length"] = seq_len
    name, model_max = min(limits.items(), key=lambda item: item[1])
    wanted = config.model.max_model_len
    if wanted is None:
        return model_max
    if wanted > model_max:
        raise ConfigError(f"max_model_len={wanted} exceeds the model's {name} of "
                          f"{model_max} tokens ({files.source})")
    return wanted


def build_processor(tokenizer: Any, hf_config: dict[str, Any], max_model_len: int,
                    enable_prompt_embeds: bool = False,
                    generation_config: GenerationConfig | None = None,
                    platform: type[Platform] | None = None,
                    pooler: PoolerConfig | None = None) -> Processor:
    """The ``Processor`` of a model, from its tokenizer and HF config (vocabulary, EOS,
    the hidden size prompt embeddings must have), its generation config (more EOS ids,
    the default ``max_tokens``), the engine's platform (what it refuses) and, for a pooling
    engine, its settled pooler config."""
    eos = eos_token_ids(hf_config, generation_config)
    defaults = generation_config.sampling_defaults() if generation_config else {}
    return Processor(tokenizer, max_model_len, int(hf_config["vocab_size"]),
                     eos[0] if eos else None, hf_config.get("hidden_size"),
                     enable_prompt_embeds, extra_eos_token_ids=eos[1:],
                     default_max_tokens=defaults.get("max_tokens"), platform=platform,
                     pooler=pooler, hf_config=hf_config)


def pooler_of(config: EngineConfig) -> PoolerConfig | None:
    """A settled config's pooler settings, for its front end; None for generation."""
    return config.pooler if config.model.runner == "pooling" else None


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        if config.parallel.data_parallel_size > 1:
            raise ConfigError(f"data_parallel_size={config.parallel.data_parallel_size}: "
                              "data-parallel engines run behind `octavo serve` (AsyncLLM); "
                              "the offline LLM runs one engine (use data_parallel_size=1)")
        self.config = config
        platform = resolve_platform(config.device.backend)
        check_names(config, get_registries(), platform)  # before the model load, not after
        files = load_model_files(config.model.model)
        self.model_files = files
        self.tokenizer = files.tokenizer
        self.max_model_len = resolve_max_model_len(config, files)
        logger.info("model %s (%s), platform %s, dtype %s, max_model_len %d", files.source,
                    ",".join(files.hf_config.get("architectures", ["?"])), platform.name,
                    config.model.torch_dtype(platform.default_dtype), self.max_model_len)
        self.generation_config = read_generation_config(files, config.model.generation_config)
        # The sampling defaults of requests that leave a field unset (vLLM's
        # get_diff_sampling_param); empty with generation_config="vllm".
        self.default_sampling_params = log_sampling_defaults(self.generation_config)
        self.core = EngineCore(config, platform, files, self.max_model_len)
        self.processor = build_processor(self.tokenizer, files.hf_config, self.max_model_len,
                                         config.model.enable_prompt_embeds,
                                         self.generation_config, platform, pooler_of(config))
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()
        self.lora_adapters = lora_registry(config, files.hf_config)

    def add_request(self, prompt: PromptType, params: SamplingParams | PoolingParams,
                    request_id: str | None = None, priority: int = 0,
                    lora_request: LoRARequest | None = None) -> str:
        """A generation request (``SamplingParams``) or a pooling one (``PoolingParams``),
        as in vLLM; each engine takes one kind (``runner``). ``lora_request``: the adapter
        it runs with (an engine with ``enable_lora``)."""
        request_id = str(next(self._ids)) if request_id is None else request_id
        lora = lora_ref(self.lora_adapters, lora_request)
        processed = self.processor.process_prompt(prompt)
        children = self.processor.make_requests(request_id, processed, params, priority)
        for child in children:
            child.lora = lora
        self.output_processor.add_request(request_id, processed.prompt, children)
        for child in children:
            self.core.add_request(child)
        return request_id

    def abort_request(self, request_id: str) -> None:
        self.core.abort_requests(self.output_processor.abort_request(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def shutdown(self) -> None:
        """Stop the worker processes now (they also stop when this process exits)."""
        self.core.shutdown()

    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        outputs, to_abort = self.output_processor.process_outputs(self.core.step())
        if to_abort:
            self.core.abort_requests(to_abort)
        return outputs
