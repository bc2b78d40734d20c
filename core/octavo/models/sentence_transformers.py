"""What a sentence-transformers folder says about pooling: ``modules.json`` lists the
modules its encode() runs after the transformer (``Pooling``, ``Normalize``, ...),
``1_Pooling/config.json`` (or wherever the Pooling module's ``path`` is) the pooling mode,
and ``sentence_bert_config.json`` the longest input (``max_seq_length``).

Octavo runs the transformer, one of the CLS / MEAN / LAST poolings, and the L2
normalisation; a folder that asks for anything else (a ``Dense`` projection, max pooling,
several modes concatenated) is refused by name, since its embeddings would silently differ
from what the folder's own encode() gives.
"""

from __future__ import annotations

import json
from pathlib import Path

from octavo.config import PoolerConfig
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.json_file import read_json_object

MODULES_FILE = "modules.json"
BERT_CONFIG_FILE = "sentence_bert_config.json"
# Pooling config flags -> the pooling type each one means (sentence-transformers' names).
POOLING_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
                 "pooling_mode_lasttoken": "LAST"}
UNSUPPORTED_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                     "pooling_mode_weightedmean_tokens")


def folder_pooler_config(folder: Path) -> PoolerConfig | None:
    """The pooling a sentence-transformers folder declares (``pooling_type`` and
    ``use_activation``: whether a ``Normalize`` module follows); None when ``folder`` has
    no ``modules.json`` (not a sentence-transformers folder)."""
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return None
    modules = _read_modules(modules_file)
    pooling_type = None
    normalize = False
    for module in modules:
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling_type = _pooling_type(folder / module.get("path", "") / "config.json")
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ModelLoadError(f"{modules_file}: module {module['type']!r} is not supported "
                                 "(Octavo runs the transformer, CLS/MEAN/LAST pooling and "
                                 "Normalize only)")
    if pooling_type is None:
        raise ModelLoadError(f"{modules_file}: lists no sentence_transformers Pooling module")
    return PoolerConfig(pooling_type=pooling_type, use_activation=normalize)


def folder_max_seq_length(folder: Path) -> int | None:
    """The longest input the folder's model takes (``sentence_bert_config.json``'s
    ``max_seq_length``, which sentence-transformers truncates to); None without one."""
    path = folder / BERT_CONFIG_FILE
    if not path.is_file():
        return None
    value = read_json_object(path).get("max_seq_length")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"{path}: max_seq_length must be a positive integer, "
                             f"got {value!r}")
    return value


def _read_modules(path: Path) -> list[dict[str, str]]:
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(modules, list) or not all(
            isinstance(m, dict) and isinstance(m.get("type"), str)
            and isinstance(m.get("path", ""), str) for m in modules):
        raise ModelLoadError(f"{path}: expected a list of modules, each with a 'type' string")
    return modules


def _pooling_type(config_path: Path) -> str:
    config = read_json_object(config_path)
    unsupported = [mode for mode in UNSUPPORTED_MODES if config.get(mode)]
    if unsupported:
        raise ModelLoadError(f"{config_path}: {unsupported[0]} is not supported "
                             "(CLS, MEAN and LAST pooling are)")
    if config.get("include_prompt") is False:
        raise ModelLoadError(f"{config_path}: include_prompt false is not supported")
    chosen = [kind for flag, kind in POOLING_MODES.items() if config.get(flag)]
    if len(chosen) != 1:
        raise ModelLoadError(f"{config_path}: expected exactly one of "
                             f"{', '.join(POOLING_MODES)} true, got {len(chosen)}")
    return chosen[0]
