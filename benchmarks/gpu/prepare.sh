#!/usr/bin/env bash
# Prepares, here on a CPU machine with the package registries, what benchmarks/gpu_check.sh
# needs on the lent GPU machine, which has no network and whose python3 is CPython 3.12 with
# torch 2.11 and triton 3.6 in its image (benchmarks/gpu/image-packages.txt):
#   .gpu/wheels/  the wheels Octavo's GPU path needs that the image lacks
#                 (cp312, manylinux x86_64), resolved against the image's own packages;
#   .gpu/build/   setuptools, which pip's isolated builds of Octavo's editable installs use
#                 there (the image's own may be older than the 77 that Octavo's
#                 pyproject.toml files need, since torch 2.11 requires setuptools<82);
#   .gpu/model/   SmolLM2-135M-Instruct's config and tokenizer. Its weights do not fit
#                 (the GGUF is 92 MB; a run carries 64 MiB in all), so gpu_check.sh fills
#                 random bf16 weights of the same shapes there: speed depends on the shapes.
# Then it checks that pip resolves Octavo's distributions against those wheels and the
# image's packages alone, and prints the folder's size. Run the check with
#   run(command="benchmarks/gpu_check.sh", carry=[".gpu"])
#   benchmarks/gpu/prepare.sh [DEST]     (DEST: default .gpu, the folder gpu_check.sh reads;
#                                         PYTHON: the interpreter whose pip runs, default
#                                         .venv/bin/python, made by scripts/install.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
DEST=${1:-.gpu}
DISTS=(octavo octavo-triton octavo-cuda)
SOURCES=(./core ./plugins/triton ./plugins/cuda)
# The image's interpreter, for pip's resolver: CPython 3.12 on x86-64 Linux (glibc 2.39).
TARGET=(--only-binary :all: --python-version 3.12 --implementation cp --abi cp312)
for n in 39 35 34 31 28 27 24 17; do TARGET+=(--platform "manylinux_2_${n}_x86_64"); done
TARGET+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

work=$(mktemp -d -t octavo-gpu-prepare.XXXX)
trap 'rm -rf "$work"' EXIT
# pip as configured on no machine: no index, find-links or constraints of this one's.
isolated_pip() { env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "$PY" -m pip "$@"; }

echo "== Octavo's distributions as wheels"
"$PY" -m pip wheel -q --no-deps -w "$work/octavo" "${SOURCES[@]}"

echo "== the image's packages as empty stand-in wheels (version +image)"
"$PY" -m pip freeze --all --exclude-editable > "$work/tested.txt"
"$PY" benchmarks/gpu/stand_ins.py benchmarks/gpu/image-packages.txt "$work/tested.txt" \
    "$work/image" > "$work/image-constraints.txt"

echo "== downloading what the image lacks"
rm -rf "$DEST/wheels"
mkdir -p "$DEST/wheels"
env -u PIP_FIND_LINKS "$PY" -m pip download -q "${TARGET[@]}" -d "$work/download" \
    --find-links "$work/octavo" --find-links "$work/image" -c "$work/image-constraints.txt" \
    "${DISTS[@]}"
for wheel in "$work"/download/*.whl; do
    name=$(basename "$wheel")
    if [ ! -e "$work/octavo/$name" ] && [ ! -e "$work/image/$name" ]; then
        cp "$wheel" "$DEST/wheels/"
    fi
done

echo "== the build backend for Octavo's editable installs there"
rm -rf "$DEST/build"
env -u PIP_FIND_LINKS "$PY" -m pip download -q --no-deps --only-binary :all: -d "$DEST/build" \
    "setuptools>=77,<82"

echo "== the model's config and tokenizer"
"$PY" benchmarks/gpu/model_files.py "$DEST/model"

echo "== pip resolves Octavo against $DEST/wheels and the image alone"
isolated_pip install --dry-run --no-index "${TARGET[@]}" --target "$work/target" \
    --find-links "$DEST/wheels" --find-links "$work/octavo" --find-links "$work/image" \
    -c "$work/image-constraints.txt" --report "$work/report.json" -q "${DISTS[@]}"
"$PY" benchmarks/gpu/stand_ins.py --summary "$work/report.json"

ls -1 "$DEST/wheels"
size=$(du -sm "$DEST" | cut -f1)
echo "$DEST: ${size} MiB (a run carries at most 64 MiB with the working tree)"
if [ "$size" -ge 48 ]; then
    echo "prepare: $DEST is too large to travel with the working tree" >&2
    exit 1
fi
