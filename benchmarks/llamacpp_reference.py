"""Record llama.cpp's greedy continuations on a GGUF file, or check Octavo against them.

    # record (llama-cpp-python in its own environment: benchmarks/README.md)
    .venv/bin/python benchmarks/llamacpp_reference.py record --gguf FILE.gguf \
        --llamacpp-python /work/llamacpp-venv/bin/python --output REF.json
    # check: Octavo on the same file, teacher-forced over llama.cpp's tokens
    .venv/bin/python benchmarks/llamacpp_reference.py check --gguf FILE.gguf --reference REF.json \
        [--quantization gguf] [--dtype bfloat16]

The prompts are a reference workload's first ``--num-prompts`` (W1_throughput: 256 random
token ids each), continued ``--output-len`` tokens. The default model's Q4_1 reference is
tests/core/models/loader/llamacpp_q4_1_w1.json, which CI checks
(test_gguf_llamacpp_reference.py); other files (a Q4_K_M that llama.cpp's quantizer made
from it) are checked here, on this machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from octavo.bench.datasets import workload_requests
from octavo.testing.llamacpp_reference import (
    Reference,
    ReferenceSequence,
    file_sha256,
    teacher_forced_agreement,
)

LOGITS_SCRIPT = Path(__file__).parent / "engines" / "llamacpp_logits.py"


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
    from octavo import LLM

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
