"""llama.cpp's greedy tokens on a GGUF file as the reference for Octavo on that file.

llama.cpp wrote the quantized files and its dequantization and dot products define what
they mean, so for a quantized GGUF its logits, not HF transformers', are the bar
(``benchmarks/llamacpp_reference.py`` records them with llama-cpp-python). The check is
teacher-forced: Octavo reads each prompt followed by llama.cpp's continuation and, at every
continuation position, its greedy choice is compared with llama.cpp's token there, so one
early difference does not derail the rest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReferenceSequence:
    """One prompt and llama.cpp's greedy continuation, with the gap between its best and
    second-best logit at each continuation position."""

    prompt: list[int]
    tokens: list[int]
    margins: list[float]


@dataclass(frozen=True)
class Reference:
    """llama.cpp's continuations of a workload's prompts on one GGUF file."""

    gguf_name: str
    gguf_sha256: str
    workload: str
    sequences: list[ReferenceSequence]

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        payload = {"gguf_name": self.gguf_name, "gguf_sha256": self.gguf_sha256,
                   "workload": self.workload, **extra,
                   "sequences": [{"prompt": s.prompt, "tokens": s.tokens,
                                  "margins": [round(m, 4) for m in s.margins]}
                                 for s in self.sequences]}
        path.write_text(json.dumps(payload) + "\n")

    @classmethod
    def load(cls, path: Path) -> Reference:
        data = json.loads(path.read_text())
        return cls(data["gguf_name"], data["gguf_sha256"], data["workload"],
                   [ReferenceSequence(s["prompt"], s["tokens"], s["margins"])
                    for s in data["sequences"]])

    def check_file(self, gguf: Path) -> None:
        """ValueError unless ``gguf`` is the very file the reference was recorded on."""
        digest = file_sha256(gguf)
        if digest != self.gguf_sha256:
            raise ValueError(f"{gguf} (sha256 {digest}) is not the file the llama.cpp "
                             f"reference was recorded on ({self.gguf_name}, sha256 "
                             f"{self.gguf_sha256})")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Agreement:
    """How many continuation positions Octavo's greedy choice equals llama.cpp's token, and
    llama.cpp's own logit gap at each position where they differ."""

    agree: int
    total: int
    disagreement_margins: list[float]

    @property
    def fraction(self) -> float:
        return self.agree / self.total

    def __str__(self) -> str:
        gaps = ", ".join(f"{m:.3f}" for m in self.disagreement_margins)
        return (f"{self.agree}/{self.total} ({100 * self.fraction:.2f}%) teacher-forced "
                f"greedy positions agree with llama.cpp; its logit gap where they differ: "
                f"[{gaps}]")


def teacher_forced_agreement(llm: Any, reference: Reference) -> Agreement:
    """Run ``llm`` (an ``octavo.LLM`` on the reference's file) teacher-forced over every
    reference sequence: its top prompt logprob at each continuation position (and its
    greedy sample after the last one) against llama.cpp's token there."""
    from octavo import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    inputs = [{"prompt_token_ids": s.prompt + s.tokens[:-1]} for s in reference.sequences]
    outputs = llm.generate(inputs, params, use_tqdm=False)
    agree = total = 0
    gaps: list[float] = []
    for seq, output in zip(reference.sequences, outputs, strict=True):
        positions = output.prompt_logprobs[len(seq.prompt):]
        choices = [_top(step) for step in positions] + [output.outputs[0].token_ids[0]]
        for choice, token, margin in zip(choices, seq.tokens, seq.margins, strict=True):
            total += 1
            if choice == token:
                agree += 1
            else:
                gaps.append(margin)
    return Agreement(agree, total, gaps)


def _top(step: dict[int, Any] | None) -> int:
    """The rank-1 token of one prompt position's logprobs."""
    assert step is not None
    return next(token for token, logprob in step.items() if logprob.rank == 1)
