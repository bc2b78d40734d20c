#!/usr/bin/env bash
# Installs the real quantization tools (issue 52), each into its own environment
# .venv-quant/TOOL beside octavo's: their pins clash with octavo's environment
# (llm-compressor 0.14.0.1: transformers<=5.17.0 and compressed-tensors==0.19.0; GPTQModel
# 7.6.0: numpy==2.2.6; GPTQModel 7.7.0 needs torch>=2.14.1, so it is not used). torch stays
# at octavo's 2.13.0 in each. benchmarks/quant_tools.py runs in them and
# tests/core/models/tool_checkpoints.py finds them (a few minutes each; not run by CI).
# Usage: scripts/install_quant_tools.sh [llmcompressor] [gptqmodel] [autoawq]   (none: all)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
declare -A PACKAGES=(
    [llmcompressor]="llmcompressor==0.14.0.1"
    [gptqmodel]="gptqmodel==7.6.0"
    [autoawq]="autoawq==0.2.9"  # AutoAWQ is deprecated upstream; 0.2.9 is its last release
)
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(llmcompressor gptqmodel autoawq)
for tool in "${tools[@]}"; do
    [ -n "${PACKAGES[$tool]:-}" ] || { echo "unknown tool $tool (${!PACKAGES[*]})" >&2; exit 2; }
    venv=.venv-quant/$tool
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "torch==2.13.0" ${PACKAGES[$tool]}
    echo "$tool installed in $venv"
done
