"""Loading a Hugging Face model folder (config.json, safetensors, tokenizer.json)."""

from __future__ import annotations

from pathlib import Path

from octavo.models.loader.config_ranges import check_config_ranges
from octavo.models.loader.files import ModelFiles
from octavo.models.loader.json_file import read_json_object
from octavo.models.loader.safetensors_weights import SafetensorsWeights
from octavo.models.loader.tokenizer import load_hf_tokenizer


def load_hf_folder(folder: Path) -> ModelFiles:
    config = read_json_object(folder / "config.json")
    check_config_ranges(config, folder / "config.json")
    weights = SafetensorsWeights.open(folder)
    tokenizer = load_hf_tokenizer(folder)
    return ModelFiles(folder, config, tokenizer, weights)
