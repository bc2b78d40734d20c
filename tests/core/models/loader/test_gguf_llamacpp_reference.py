"""The default GGUF (SmolLM2-135M, Q4_1 with a Q8_0 embedding) kept in its blocks and
multiplied by the CPU's quantized kernels, against llama.cpp's own greedy tokens on that
very file (llama.cpp wrote it: its math is the reference), teacher-forced over W1's first
six prompts x 64 tokens. The reference was recorded with llama-cpp-python 0.3.36
(``benchmarks/llamacpp_reference.py record``); the file's sha256 pins it."""

from __future__ import annotations

from pathlib import Path

from octavo import LLM
from octavo.models.loader import default_model_path
from octavo.testing.llamacpp_reference import Reference, teacher_forced_agreement

REFERENCE = Path(__file__).parent / "llamacpp_q4_1_w1.json"


def test_quantized_default_model_agrees_with_llamacpp() -> None:
    reference = Reference.load(REFERENCE)
    gguf = default_model_path()
    reference.check_file(gguf)
    llm = LLM(quantization="gguf", max_model_len=512, kv_cache_memory=64 * 2**20)
    agreement = teacher_forced_agreement(llm, reference)
    print(agreement)
    assert agreement.fraction >= 0.99, str(agreement)
