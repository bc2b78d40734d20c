"""Tokenizers from local files only: an HF folder's tokenizer.json, or a GGUF's metadata."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from octavo.models.loader.errors import ModelLoadError


def load_hf_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The fast tokenizer of an HF folder (tokenizer.json, plus tokenizer_config.json's special
    tokens and chat template); ``local_files_only`` so no hub is ever contacted."""
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(f"{folder}: no tokenizer.json in the model folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder / 'tokenizer.json'}: cannot load the tokenizer: {e}") from e
    if not tokenizer.is_fast:
        raise ModelLoadError(f"{folder / 'tokenizer.json'}: did not load as a fast tokenizer")
    return tokenizer


def load_gguf_tokenizer(path: Path, chat_template: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer described by a GGUF's ``tokenizer.ggml.*`` metadata, via transformers'
    GGUF conversion, with the file's own chat template."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{path}: cannot build the tokenizer from its metadata: {e}") from e
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
