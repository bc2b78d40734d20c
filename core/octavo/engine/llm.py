"""``LLM``: the offline API, as in vLLM - ``LLM(model=...).generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from octavo.config import EngineConfig
from octavo.engine.llm_engine import LLMEngine
from octavo.engine.outputs import EmbeddingRequestOutput, RequestOutput
from octavo.engine.processor import PromptType
from octavo.lora_request import LoRARequest
from octavo.pooling_params import PoolingParams
from octavo.sampling_params import SamplingParams

ChatMessages = list[dict[str, str]]


class LLM:
    """An engine in this process. Keywords follow vLLM's ``LLM(...)``: ``model``,
    ``dtype``, ``seed``, ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``block_size``, ``enable_prefix_caching``, ``kv_cache_memory`` (bytes),
    ``speculative_config`` and ``kv_transfer_config`` (a dict or JSON text), and every other
    field of the config's parts (``octavo.config``), plus Octavo's ``backend`` ("auto",
    "cpu", ...)."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig.from_kwargs(model=model, **kwargs))

    def shutdown(self) -> None:
        """Stop the worker processes of a multi-worker engine now, rather than at exit."""
        self.llm_engine.shutdown()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` use when given no sampling params: the built-in
        defaults with the model's generation_config.json on top (``generation_config``
        "auto", the default; "vllm" leaves the built-in ones), as in vLLM."""
        return SamplingParams(**self.llm_engine.default_sampling_params)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. A prompt dict
        may carry a ``cache_salt`` (vLLM's key): prompts share prefix-cache blocks only with
        prompts of the same salt. ``lora_request``: the LoRA adapter of every prompt, or one
        per prompt (None: the base model), as in vLLM."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = _as_params_list(sampling_params, len(prompt_list))
        loras = _as_lora_list(lora_request, len(prompt_list))
        ids = [self.llm_engine.add_request(p, sp, priority=priority[i] if priority else 0,
                                           lora_request=loras[i])
               for i, (p, sp) in enumerate(zip(prompt_list, params_list))]
        return self._run(ids, use_tqdm)  # type: ignore[return-value]

    def chat(
        self,
        messages: ChatMessages | list[ChatMessages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations, formatted with the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts: list[PromptType] = [
            {"prompt_token_ids": self.get_tokenizer().apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, tokenize=True,
                return_dict=False, **(chat_template_kwargs or {}))}
            for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt, in prompt order (vLLM's ``LLM.embed``), from an engine
        run with ``runner="pooling"`` (the default for an encoder such as BertModel).
        ``pooling_params`` (``dimensions``, ``use_activation``) apply to every prompt."""
        params = pooling_params if pooling_params is not None else PoolingParams()
        ids = [self.llm_engine.add_request(prompt, params)
               for prompt in _as_prompt_list(prompts)]
        return self._run(ids, use_tqdm)  # type: ignore[return-value]

    def _run(self, request_ids: list[str], use_tqdm: bool,
             ) -> list[RequestOutput | EmbeddingRequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput | EmbeddingRequestOutput] = {}
        with tqdm(total=len(request_ids), desc="Processed prompts", unit="req",
                  disable=not use_tqdm, dynamic_ncols=True) as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[i] for i in request_ids]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [[int(t) for t in items]]  # type: ignore[arg-type]  # one prompt of token ids
    return items  # type: ignore[return-value]


def _as_params_list(params: SamplingParams | Sequence[SamplingParams],
                    count: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts")
    return params


def _as_lora_list(lora: LoRARequest | Sequence[LoRARequest | None] | None,
                  count: int) -> list[LoRARequest | None]:
    if lora is None or isinstance(lora, LoRARequest):
        return [lora] * count
    loras = list(lora)
    if len(loras) != count:
        raise ValueError(f"got {len(loras)} LoRA requests for {count} prompts")
    return loras
