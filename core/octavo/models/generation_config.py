"""A model's ``generation_config.json``: more EOS ids, and the sampling defaults its makers
recommend, applied to requests that leave those fields unset (vLLM's
``--generation-config auto|vllm|PATH`` and ``ModelConfig.get_diff_sampling_param``).

Which file: ``auto`` and ``vllm`` read the model folder's (``vllm`` still takes its EOS
ids, as vLLM does, and only ignores its sampling defaults); any other value names a folder
holding one. A GGUF file has no such file: its EOS ids come with its config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from octavo.models.loader import ModelFiles, ModelLoadError
from octavo.models.loader.json_file import read_json_object
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
# The HF fields taken as defaults, and the SamplingParams field each becomes.
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}
INT_FIELDS = ("top_k", "max_new_tokens")


@dataclass(frozen=True)
class GenerationConfig:
    """The generation config in force: the file read (None: there is none) and what it
    holds, and whether its sampling defaults apply (not with ``vllm``)."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)
    apply_sampling_defaults: bool = True

    @property
    def eos_token_ids(self) -> list[int]:
        """Its ``eos_token_id``: one id or a list, as in config.json."""
        ids = _id_list(self.values.get("eos_token_id"))
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ModelLoadError(f"{self.path}: eos_token_id must be a token id or a list of "
                                 f"them, got {self.values['eos_token_id']!r}")
        return ids

    def sampling_defaults(self) -> dict[str, Any]:
        """SamplingParams fields (``max_new_tokens`` as ``max_tokens``) the file sets, to
        use where a request leaves them unset; checked, so a bad file fails at start."""
        if not self.apply_sampling_defaults:
            return {}
        defaults: dict[str, Any] = {}  # SamplingParams keyword arguments
        for name, param in SAMPLING_FIELDS.items():
            value = self.values.get(name)
            if value is None:
                continue
            kinds = (int,) if name in INT_FIELDS else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ModelLoadError(f"{self.path}: {name} must be a number, got {value!r}")
            defaults[param] = value
        try:
            SamplingParams(**defaults)
        except ValueError as exc:
            raise ModelLoadError(f"{self.path}: {exc}") from None
        return defaults


def read_generation_config(files: ModelFiles, setting: str) -> GenerationConfig:
    """The generation config ``setting`` (``ModelConfig.generation_config``) selects."""
    if setting in ("auto", "vllm"):
        path = files.source / GENERATION_CONFIG_FILE
        if not path.is_file():  # none in the folder, or a GGUF file
            return GenerationConfig(apply_sampling_defaults=setting == "auto")
        return GenerationConfig(path, read_json_object(path), setting == "auto")
    folder = Path(setting).expanduser()
    if not (folder / GENERATION_CONFIG_FILE).is_file():
        raise ModelLoadError(f"generation_config {setting!r}: expected auto, vllm or a folder "
                             f"holding {GENERATION_CONFIG_FILE}, and {folder} holds none")
    path = folder / GENERATION_CONFIG_FILE
    return GenerationConfig(path, read_json_object(path))


def log_sampling_defaults(generation_config: GenerationConfig) -> dict[str, Any]:
    """The sampling defaults, said once at start-up (vLLM's warning) when there are any."""
    defaults = generation_config.sampling_defaults()
    if defaults:
        logger.warning("Default sampling parameters have been overridden by the model's "
                       "Hugging Face generation config (%s): %s. Requests that set a field "
                       "keep their value; --generation-config vllm ignores the file.",
                       generation_config.path,
                       ", ".join(f"{k}={v}" for k, v in defaults.items()))
    return defaults


def _id_list(value: Any) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]
