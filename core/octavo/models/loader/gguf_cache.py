"""The conversion cache: each GGUF converted once into an HF folder, reused on every start.

Reading a GGUF is slow in pure Python: parsing its metadata, building the tokenizer from
it (transformers parses the whole file again) and dequantizing every tensor take seconds
each. Their result never changes for a given file, so the first load writes it out as an HF
folder - ``model.safetensors`` (the HF-named weights, exactly what the GGUF loader yields:
a quantized weight as its uint8 blocks, its GGUF type in the file's metadata under
``GGML_TYPES``, so an entry is about the GGUF's size, not fp32's), ``config.json`` (the
synthesized config) and the tokenizer files - and later loads read that folder through the
ordinary HF-folder loader, weights memory-mapped.

Where: ``$OCTAVO_CACHE_DIR``, else the user cache folder (``~/.cache/octavo`` on Linux),
under ``gguf/<file stem>-<hash>``; the hash covers the GGUF's resolved path, size and
modification time and the cache format, so an edited or replaced file gets a new entry (and
its old one is removed). An entry is built in a temporary folder and renamed into place, so
a crash mid-write leaves no entry; its manifest, written last, records every file's size,
and an entry whose files do not match it, or that fails to load, is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file
from tqdm.auto import tqdm

from octavo.models.loader.files import ModelFiles
from octavo.models.loader.quantized import GgufTensor
from octavo.paths import cache_root

logger = logging.getLogger(__name__)

FORMAT_VERSION = 4  # bump when what an entry holds, or how it is derived, changes
MANIFEST = "octavo-cache.json"
WEIGHTS = "model.safetensors"
GGML_TYPES = "octavo.ggml_types"  # metadata key: JSON {weight name: GGUF type of its blocks}


def entry_path(gguf: Path) -> Path:
    """The entry of this exact file: same path, size and mtime -> same folder."""
    source = gguf.resolve()
    stat = source.stat()
    key = f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}\0{FORMAT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{source.stem}-{digest}"


def lookup(gguf: Path) -> Path | None:
    """The complete entry of ``gguf``, or None. An entry that is there but does not match
    its manifest is removed, so the caller rebuilds it."""
    entry = entry_path(gguf)
    if not entry.exists():
        return None
    problem = _check_entry(entry)
    if problem is None:
        return entry
    discard(entry, problem)
    return None


def discard(entry: Path, problem: str) -> None:
    logger.warning("conversion cache entry %s is unusable (%s); rebuilding it", entry, problem)
    shutil.rmtree(entry, ignore_errors=True)


def store(gguf: Path, files: ModelFiles) -> Path | None:
    """Write ``files`` (loaded from ``gguf``) as an entry; returns its folder, or None when
    the cache cannot be written (the caller then uses ``files`` directly)."""
    entry = entry_path(gguf)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError as e:
        logger.warning("cannot write the conversion cache in %s (%s); converting %s in "
                       "memory on every start", entry.parent, e, gguf.name)
        return None
    try:
        _write_entry(building, gguf, files)
        _remove_older_entries(gguf, entry)
        os.rename(building, entry)
    except OSError as e:
        shutil.rmtree(building, ignore_errors=True)
        if lookup(gguf) is not None:  # another process stored the same entry first
            return entry
        logger.warning("cannot write the conversion cache entry %s (%s); converting %s in "
                       "memory on every start", entry, e, gguf.name)
        return None
    return entry


def _write_entry(folder: Path, gguf: Path, files: ModelFiles) -> None:
    weights, types = {}, {}
    for name, tensor in tqdm(files.weights, total=len(files.weights), unit="tensor",
                             desc=f"Converting {gguf.name} (once; cached in {folder.parent})"):
        if isinstance(tensor, GgufTensor):
            types[name] = tensor.ggml_type
            tensor = tensor.blocks
        weights[name] = tensor.contiguous()
    save_file(weights, folder / WEIGHTS, metadata={GGML_TYPES: json.dumps(types)})
    del weights
    files.tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(files.hf_config, indent=2))
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    manifest = {"format": FORMAT_VERSION, "source": str(gguf.resolve()), "files": sizes}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _check_entry(entry: Path) -> str | None:
    """What is wrong with an entry (a problem to log), or None when it is complete."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        sizes = manifest["files"]
        if manifest["format"] != FORMAT_VERSION or WEIGHTS not in sizes:
            return "written by another version"
        for name, size in sizes.items():
            actual = (entry / name).stat().st_size
            if actual != size:
                return f"{name} has {actual} bytes, the manifest says {size}"
    except FileNotFoundError as e:
        return f"{Path(e.filename).name} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable manifest: {e}"
    return None


def _remove_older_entries(gguf: Path, entry: Path) -> None:
    """Drop entries of earlier versions of the same file (same path, other size/mtime) -
    never ``entry`` itself: another process (a data-parallel engine converting the same file
    at the same time) may have just stored it, and be loading it."""
    source = str(gguf.resolve())
    for old in entry.parent.glob(f"{gguf.resolve().stem}-*"):
        if old == entry:
            continue
        try:
            if json.loads((old / MANIFEST).read_text()).get("source") == source:
                shutil.rmtree(old, ignore_errors=True)
        except (OSError, ValueError, AttributeError):
            continue
