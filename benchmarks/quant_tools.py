"""Quantized checkpoints written by the real tools (issue 52): llm-compressor (fp8, W8A8
int8, W4A16), GPTQModel (GPTQ) and AutoAWQ (AWQ), each calibrated on fixed random token
prompts, and the same model dequantized to fp32 by the tool's own code.

Run by a tool's own Python (``scripts/install_quant_tools.sh TOOL`` makes
``.venv-quant/TOOL``): the tools pin transformers, compressed-tensors and numpy releases
that octavo's environment does not have, so this file imports nothing from octavo and
octavo's environment only reads what it writes.

    .venv-quant/llmcompressor/bin/python benchmarks/quant_tools.py llmcompressor \\
        --dense DENSE_HF_FOLDER --out OUT [--schemes w4a16,w8a8,fp8,fp8-dynamic]

writes, per scheme, ``OUT/SCHEME`` (the checkpoint as the tool saves it) and
``OUT/SCHEME-exact`` (its decoder weights dequantized to fp32 by the tool: compressed-
tensors' decompressor, GPTQModel's ``dequantize_weight``, AutoAWQ's ``dequantize_gemm``;
everything else copied from DENSE). The exact folder is the reference octavo's logits are
checked against: a layout error on octavo's side moves weights by whole quantization
steps, which this reference, computed without octavo, would show.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

GROUP = 64  # SmolLM2's 576 hidden features are not whole groups of 128
SEED = 0
LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                   "down_proj")


def calibration(vocab_size: int, samples: int, length: int) -> list[list[int]]:
    """Fixed random token prompts (no data set: nothing is fetched)."""
    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab_size, (samples, length), generator=gen).tolist()


def load_dense(dense: Path):
    """The dense HF model in fp32 (the tools quantize it in place)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dense), dtype=torch.float32)


def write_exact(dense: Path, folder: Path, exact: Path,
                weights: dict[str, torch.Tensor]) -> None:
    """The checkpoint in ``folder`` with each quantized layer's tensors replaced by its
    dequantized ``weights`` (fp32), every other tensor as the tool saved it (AWQ folds its
    scales into the norms), in DENSE's config: a dense fp32 model of DENSE's tensor names."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    for name, weight in weights.items():
        prefix = name.removesuffix("weight")
        for key in [k for k in tensors if k.startswith(prefix)]:
            del tensors[key]
        tensors[name] = weight
    expected = load_file(dense / "model.safetensors")
    if sorted(tensors) != sorted(expected):
        raise SystemExit(f"{folder}: dequantized tensors {sorted(set(tensors) ^ set(expected))}"
                         " differ from the dense model's")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise SystemExit(f"{name}: dequantized {tuple(tensor.shape)}, dense "
                             f"{tuple(expected[name].shape)}")
    shutil.copytree(dense, exact, dirs_exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in tensors.items()},
              exact / "model.safetensors")


# llm-compressor -----------------------------------------------------------------------

def _llmcompressor_recipe(scheme: str):
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    ignore = ["lm_head"]
    if scheme == "w4a16":  # GPTQ, 4-bit symmetric groups (the W4A16 preset at group 64)
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": GROUP}
        return GPTQModifier(ignore=ignore, config_groups={
            "group_0": {"targets": ["Linear"], "weights": weights}})
    if scheme == "w8a8":  # GPTQ weights, int8 per channel; dynamic per-token activations
        return GPTQModifier(targets="Linear", scheme="W8A8", ignore=ignore)
    if scheme == "fp8":  # per-tensor weight and static activation scales (calibrated)
        return QuantizationModifier(targets="Linear", scheme="FP8", ignore=ignore)
    if scheme == "fp8-dynamic":  # per-channel weight scales, dynamic activations
        return QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=ignore)
    raise SystemExit(f"unknown llm-compressor scheme {scheme!r}")


def llmcompressor(dense: Path, out: Path, scheme: str, prompts: list[list[int]]) -> None:
    from datasets import Dataset
    from llmcompressor import oneshot

    model = load_dense(dense)
    data = Dataset.from_dict({"input_ids": prompts,
                              "attention_mask": [[1] * len(p) for p in prompts]})
    oneshot(model=model, recipe=_llmcompressor_recipe(scheme), dataset=data,
            num_calibration_samples=len(prompts), max_seq_length=len(prompts[0]),
            shuffle_calibration_samples=False)
    folder = out / scheme
    model.save_pretrained(str(folder), save_compressed=True)
    _copy_tokenizer(dense, folder)
    write_exact(dense, folder, out / f"{scheme}-exact", _decompressed(folder))


def _decompressed(folder: Path) -> dict[str, torch.Tensor]:
    """compressed-tensors' own decompressor over the saved checkpoint (transformers'
    ``run_compressed=False`` load): the dense weight of every quantized layer, in fp32."""
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(run_compressed=False))
    return {name: tensor.detach().float() for name, tensor in model.state_dict().items()
            if name.endswith(".weight") and name.split(".")[-2] in LINEAR_SUFFIXES}


def _copy_tokenizer(dense: Path, folder: Path) -> None:
    for path in dense.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, folder / path.name)


# GPTQModel -----------------------------------------------------------------------------

GPTQMODEL_SCHEMES = {  # scheme: the config's fields (format gptq: AutoGPTQ's v1 zeros)
    "gptq-4bit": dict(bits=4, group_size=GROUP, sym=True, desc_act=False),
    "gptq-4bit-act-order": dict(bits=4, group_size=32, sym=False, desc_act=True),
    "gptq-8bit": dict(bits=8, group_size=-1, sym=True, desc_act=False,
                      act_group_aware=False),  # GAR needs groups
}  # GPTQModel's AWQConfig is not offered: on the CPU it stops with "AWQ: CUDA is not available"


def gptqmodel(dense: Path, out: Path, scheme: str, prompts: list[list[int]]) -> None:
    # GPTQModel 7.6 gives a 2-core machine one CPU worker, then asks for two ("Virtual pool
    # 'model_loader:cpu' requests 2 workers but parent 'cpu' only has 1")
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQConfig, GPTQModel

    fields = dict(GPTQMODEL_SCHEMES[scheme])
    config = GPTQConfig(**fields)
    model = GPTQModel.load(str(dense), config, device="cpu")
    model.quantize([{"input_ids": p, "attention_mask": [1] * len(p)} for p in prompts],
                   batch_size=1)
    folder = out / scheme
    model.save(str(folder))
    del model
    write_exact(dense, folder, out / f"{scheme}-exact", _gptqmodel_dequantized(folder))


def _gptqmodel_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """GPTQModel's own ``dequantize_weight`` of each quantized layer of the saved
    checkpoint (loaded with its torch kernels), as ``[out, in]`` fp32."""
    from gptqmodel import BACKEND, GPTQModel

    # TorchLinear dequantizes in the model's dtype, fp16 or bf16 only: fp16 rounds once
    model = GPTQModel.load(str(folder), device="cpu", backend=BACKEND.TORCH,
                           dtype=torch.float16)
    weights = {}
    for name, module in model.model.named_modules():
        if hasattr(module, "dequantize_weight") and name.split(".")[-1] in LINEAR_SUFFIXES:
            weight = module.dequantize_weight().detach().float()  # [in, out]
            weights[name + ".weight"] = weight.T.contiguous()
    return weights


# AutoAWQ -------------------------------------------------------------------------------

def autoawq(dense: Path, out: Path, scheme: str, prompts: list[list[int]]) -> None:
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(str(dense))
    model.quantize(AutoTokenizer.from_pretrained(str(dense)), calib_data=prompts,
                   quant_config={"zero_point": True, "q_group_size": GROUP, "w_bit": 4,
                                 "version": "GEMM"},
                   max_calib_samples=len(prompts), max_calib_seq_len=len(prompts[0]))
    folder = out / scheme
    model.save_quantized(str(folder))
    _copy_tokenizer(dense, folder)
    write_exact(dense, folder, out / f"{scheme}-exact", _awq_dequantized(folder))


def _awq_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """AutoAWQ's own ``dequantize_gemm`` of each layer's tensors, as ``[out, in]`` fp32."""
    from awq.utils.packing_utils import dequantize_gemm

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    group = json.loads((folder / "config.json").read_text())["quantization_config"][
        "group_size"]
    return {prefix + "weight": dequantize_gemm(
                tensors[prefix + "qweight"], tensors[prefix + "qzeros"],
                tensors[prefix + "scales"].float(), 4, group).T.float().contiguous()
            for prefix in (n.removesuffix("qweight") for n in tensors
                           if n.endswith(".qweight"))}


TOOLS = {"llmcompressor": (llmcompressor, ("w4a16", "w8a8", "fp8", "fp8-dynamic")),
         "gptqmodel": (gptqmodel, tuple(GPTQMODEL_SCHEMES)),
         "autoawq": (autoawq, ("awq",))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=sorted(TOOLS))
    parser.add_argument("--dense", type=Path, required=True, help="a dense HF Llama folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--schemes", help="comma-separated (default: all of the tool's)")
    parser.add_argument("--samples", type=int, default=8, help="calibration prompts")
    parser.add_argument("--length", type=int, default=64, help="tokens per prompt")
    args = parser.parse_args()
    write, schemes = TOOLS[args.tool]
    vocab = json.loads((args.dense / "config.json").read_text())["vocab_size"]
    prompts = calibration(vocab, args.samples, args.length)
    for scheme in args.schemes.split(",") if args.schemes else schemes:
        write(args.dense, args.out, scheme, prompts)
        print(f"wrote {args.out / scheme}", flush=True)


if __name__ == "__main__":
    main()
