#!/usr/bin/env bash
# GPU check, for a machine with one NVIDIA GPU (CI has none; everything here is also proven
# without one by the test suite, under Triton's interpreter and by ahead-of-time compiles):
#   1. the kernel tests, run on the GPU (tests/triton, tests/cuda);
#   2. each Triton kernel timed against its torch reference;
#   3. W1_throughput and W2_latency with --backend cuda, CUDA graphs on and off;
#   4. on a machine with two GPUs or more, W2_latency at -tp 2 (one worker process per GPU,
#      NCCL between them);
# then one table. Each step has its own time limit; the whole stays under 8 minutes.
#
#   benchmarks/gpu_check.sh [OUT_DIR]        (default: a new temporary folder)
# Environment: PYTHON (default .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-$(mktemp -d -t octavo-gpu-check.XXXX)}
mkdir -p "$OUT"
start=$SECONDS
step() { echo; echo "== $1 ($((SECONDS - start)) s elapsed)"; }

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA GPU here; nothing to check" >&2
    exit 2
fi
"$PY" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"

step "kernel tests on the GPU"
timeout 150 "$PY" -m pytest tests/triton tests/cuda -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests.log" | tail -n 5
tail -n 1 "$OUT/tests.log" | sed 's/=//g' > "$OUT/tests.summary"

step "kernel timings against torch"
timeout 60 "$PY" benchmarks/gpu_check.py times "$OUT" 2>&1 | tee "$OUT/kernels.log"

for mode in graphs eager; do
    flags=()
    if [ "$mode" = eager ]; then flags=(--enforce-eager); fi
    step "W1_throughput, --backend cuda, $mode"
    timeout 70 "$PY" -m octavo bench throughput --workload W1_throughput --backend cuda \
        "${flags[@]}" --output-json "$OUT/W1_throughput_$mode.json" > "$OUT/W1_$mode.log" 2>&1 \
        || echo "W1 $mode failed: see $OUT/W1_$mode.log"
    tail -n 4 "$OUT/W1_$mode.log"
    step "W2_latency, --backend cuda, $mode"
    timeout 45 "$PY" -m octavo bench latency --workload W2_latency --backend cuda \
        "${flags[@]}" --output-json "$OUT/W2_latency_$mode.json" > "$OUT/W2_$mode.log" 2>&1 \
        || echo "W2 $mode failed: see $OUT/W2_$mode.log"
    tail -n 4 "$OUT/W2_$mode.log"
done

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)"; then
    step "W2_latency, --backend cuda, -tp 2"
    timeout 90 "$PY" -m octavo bench latency --workload W2_latency --backend cuda -tp 2 \
        --output-json "$OUT/W2_latency_tp2.json" > "$OUT/W2_tp2.log" 2>&1 \
        || echo "W2 -tp 2 failed: see $OUT/W2_tp2.log"
    tail -n 4 "$OUT/W2_tp2.log"
else
    echo; echo "== -tp 2 skipped: it needs two GPUs"
fi

step "summary (logs and JSON in $OUT)"
"$PY" benchmarks/gpu_check.py table "$OUT"
echo "gpu_check done in $((SECONDS - start)) s"
