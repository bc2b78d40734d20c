"""Loading a Hugging Face model folder (config.json, safetensors, tokenizer.json)."""

from __future__ import annotations

from pathlib import Path

from octavo.models.loader.config_ranges import check_config_ranges
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.files import ModelFiles
from octavo.models.loader.json_file import read_json_object
from octavo.models.loader.safetensors_weights import SafetensorsWeights
from octavo.models.loader.tokenizer import load_hf_tokenizer


def load_hf_folder(folder: Path) -> ModelFiles:
    config = read_json_object(folder / "config.json")
    check_config_ranges(config, folder / "config.json")
    weights = SafetensorsWeights.open(folder)
    tokenizer = load_hf_tokenizer(folder)
    return ModelFiles(folder, config, tokenizer, weights,
                      quantization=quant_method(config, folder / "config.json"))


def quant_method(config: dict, config_file: Path) -> str | None:
    """The checkpoint's ``quantization_config.quant_method`` (vLLM's ``--quantization``
    names); None for dense weights."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if not isinstance(method, str):
        raise ModelLoadError(f"{config_file}: quantization_config has no quant_method string")
    return method
