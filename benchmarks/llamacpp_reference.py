"""llama.cpp's greedy tokens on a GGUF file as the reference for Octavo on that file: record
them, or check Octavo against them.

llama.cpp wrote the quantized files and its dequantization and dot products define what
they mean, so for a quantized GGUF its logits, not HF transformers', are the bar. The check
is teacher-forced: Octavo reads each prompt followed by llama.cpp's continuation and, at
every continuation position, its greedy choice is compared with llama.cpp's token there, so
one early difference does not derail the rest.

    # record (llama-cpp-python in its own environment: benchmarks/README.md)
    .venv/bin/python benchmarks/llamacpp_reference.py record --gguf FILE.gguf \
        --llamacpp-python /work/llamacpp-venv/bin/python --output REF.json
    # check: Octavo on the same file, teacher-forced over llama.cpp's tokens
    .venv/bin/python benchmarks/llamacpp_reference.py check --gguf FILE.gguf --reference REF.json \
        [--quantization gguf] [--dtype bfloat16]

The prompts are a reference workload's first ``--num-prompts`` (W1_throughput: 256 random
token ids each), continued ``--output-len`` tokens. benchmarks/references/ holds the default
model's Q4_1 reference (llama-cpp-python 0.3.36, its default f16 KV cache); RESULTS.md gives
the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo import LLM, SamplingParams
from octavo.bench.datasets import workload_requests

LOGITS_SCRIPT = Path(__file__).parent / "engines" / "llamacpp_logits.py"


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
    """The most likely token of one prompt position's logprobs (the top-1 is always among
    them; where the given token ties with it, ranks count both and only one is listed)."""
    assert step is not None
    return max(step.items(), key=lambda item: item[1].logprob)[0]


def record(args: argparse.Namespace) -> None:
    prompts = [list(r.prompt) for r in workload_requests(args.workload)][: args.num_prompts]
    with tempfile.TemporaryDirectory() as tmp:
        prompts_path, out_path = Path(tmp) / "prompts.json", Path(tmp) / "out.json"
        prompts_path.write_text(json.dumps(prompts))
        subprocess.run([args.llamacpp_python, str(LOGITS_SCRIPT), str(args.gguf),
                        str(prompts_path), str(args.output_len), str(out_path),
                        str(args.threads)], check=True)
        recorded = json.loads(out_path.read_text())
    sequences = [ReferenceSequence(s["prompt"], s["tokens"],
                                   [best - second for best, second in s["top2_logits"]])
                 for s in recorded["sequences"]]
    reference = Reference(args.gguf.name, file_sha256(args.gguf), args.workload, sequences)
    reference.save(args.output, {"llama_cpp_python": recorded["llama_cpp_python"],
                                 "output_len": args.output_len})
    print(f"wrote {args.output}: {len(sequences)} sequences of {args.output_len} tokens")


def check(args: argparse.Namespace) -> None:
    reference = Reference.load(args.reference)
    reference.check_file(args.gguf)
    llm = LLM(model=str(args.gguf), quantization=args.quantization, dtype=args.dtype,
              max_model_len=1024)
    agreement = teacher_forced_agreement(llm, reference)
    print(f"{args.gguf.name} --quantization {args.quantization} --dtype {args.dtype}: "
          f"{agreement}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("--gguf", type=Path, required=True)
    rec.add_argument("--llamacpp-python", required=True)
    rec.add_argument("--output", type=Path, required=True)
    rec.add_argument("--workload", default="W1_throughput")
    rec.add_argument("--num-prompts", type=int, default=6)
    rec.add_argument("--output-len", type=int, default=64)
    rec.add_argument("--threads", type=int, default=2)
    chk = commands.add_parser("check")
    chk.add_argument("--gguf", type=Path, required=True)
    chk.add_argument("--reference", type=Path, required=True)
    chk.add_argument("--quantization", default="gguf")
    chk.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
    else:
        check(args)


if __name__ == "__main__":
    main()
