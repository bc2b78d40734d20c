"""The default model's config and tokenizer as an HF folder without weights, for the GPU
check (benchmarks/gpu/prepare.sh): the weights stay behind because the 92 MB GGUF does not
fit in what a run carries, and the check fills random weights of the same shapes.

    model_files.py DEST   write config.json and the tokenizer's files into DEST
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from octavo.models.loader.default_model import default_model_path
from octavo.models.loader.gguf_file import load_gguf


def main(dest: Path) -> None:
    files = load_gguf(default_model_path())
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    config = dict(files.hf_config, torch_dtype="bfloat16")
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    files.tokenizer.save_pretrained(dest)
    print(f"{dest}: {', '.join(sorted(p.name for p in dest.iterdir()))}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
