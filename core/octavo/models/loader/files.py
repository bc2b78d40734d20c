"""ModelFiles: what a loader hands to the rest of the engine, whatever the file format."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm

from octavo.models.loader.quantized import Weight

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class WeightSource(Protocol):
    """A format's tensors under Hugging Face parameter names, read lazily one at a time
    (a GGUF's quantized weights as ``GgufTensor``)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[str, Weight]]: ...

    def file_of(self, name: str) -> Path: ...


@dataclass
class ModelFiles:
    """A model on disk: its HF-style config, its tokenizer and a way to stream its weights.

    Models are built from ``hf_config`` and fill their parameters from ``iter_weights()``, so
    they need not know whether the weights came from safetensors shards or a GGUF file.
    """

    source: Path  # the HF folder or the .gguf file
    hf_config: dict[str, Any]  # config.json content, or one synthesized from GGUF metadata
    tokenizer: PreTrainedTokenizerBase  # fast tokenizer with its chat template set
    weights: WeightSource
    # The quantization the weights come in (vLLM's --quantization names): "gguf" for a
    # GGUF file, whose block-typed weights the stream yields as ``GgufTensor``; None: dense.
    quantization: str | None = None

    def iter_weights(self) -> Iterator[tuple[str, Weight]]:
        """Yield ``(hf_name, tensor)`` for every stored weight, with a progress bar."""
        yield from tqdm(
            self.weights, total=len(self.weights), desc=f"Loading {self.source.name}", unit="tensor"
        )

    def weight_file_of(self, name: str) -> Path:
        """The file that holds weight ``name``, for error messages about that weight."""
        return self.weights.file_of(name)
