#!/usr/bin/env bash
# GPU check, for the lent machine with one NVIDIA GPU (CI has none; everything here is also
# proven without one by the test suite, under Triton's interpreter and by ahead-of-time
# compiles). That machine has no network, and its python3 (CPython 3.12) holds torch 2.11
# and triton 3.6 but not all of Octavo's needs, so prepare here first:
#   benchmarks/gpu/prepare.sh           (writes .gpu/: the missing wheels, the model's files)
# then, through the device tool, one call:
#   run(command="benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=540)
# It
#   0. installs .gpu/wheels and Octavo's distributions (editable, no deps) into python3's
#      environment, offline, and fills .gpu/model with random bf16 weights of
#      SmolLM2-135M's shapes (its real weights do not fit in what a run carries);
#   1. runs the kernel tests on the GPU (tests/triton, tests/cuda);
#   2. times each Triton kernel against its torch reference;
#   3. runs W1_throughput and W2_latency with --backend cuda, CUDA graphs on and off;
#   4. runs W2_latency at TP=1 through the multi-process executor (a worker process), and
#      with --no-async-scheduling (the runs above have async scheduling, the default: the
#      worker on a thread, step N+1 planned while N runs);
#   5. on a machine with two GPUs or more, W2_latency at -tp 2 (NCCL between workers), and
#      16 requests to a random Mixtral served at -dp 2 --enable-expert-parallel (NCCL
#      all-to-alls between the engines' workers; benchmarks/gpu/dp_ep.sh), and
#      W1_throughput at -pp 2 with pipeline micro-batches (two steps in flight) and without;
# then prints one table. Each step has its own time limit, and the whole stops after 8
# minutes. Without a CUDA GPU it stops at once with exit code 2.
#
#   benchmarks/gpu_check.sh [OUT_DIR]   (default: $OUT, the device tool's output folder,
#                                        else a new temporary folder)
# OUT_DIR receives summary.txt (the table), image-freeze.txt (the image's packages) and
# logs.tar.gz (every log and JSON). Environment: PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${1:-${OUT:-$(mktemp -d -t octavo-gpu-check.XXXX)}}
BUDGET=470  # seconds for all steps: 8 minutes with the packing at the end
MODEL=.gpu/model
start=$SECONDS

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        2>/dev/null; then
    echo "gpu_check: no CUDA GPU here ($PY has no torch, or its torch sees no GPU);" \
         "nothing to check" >&2
    exit 2
fi
LOGS="$OUT_DIR/logs"
mkdir -p "$LOGS"
pack() {
    tar -czf "$OUT_DIR/logs.tar.gz" -C "$OUT_DIR" logs && rm -rf "$LOGS"
    echo "gpu_check done in $((SECONDS - start)) s; results in $OUT_DIR"
}
trap pack EXIT

step() { echo; echo "== $1 ($((SECONDS - start)) s elapsed)"; }
# The time a step may take: its own limit, or what is left of the budget if that is less.
limit() {
    local left=$((BUDGET - (SECONDS - start)))
    if [ "$left" -lt 10 ]; then echo 0; else echo $((left < $1 ? left : $1)); fi
}
# run_step NAME LIMIT LOG COMMAND...: run COMMAND under its limit, its output in LOG.
run_step() {
    local name=$1 seconds log=$3
    seconds=$(limit "$2")
    shift 3
    step "$name"
    if [ "$seconds" = 0 ]; then echo "skipped: the 8-minute budget is spent"; return 1; fi
    if ! timeout "$seconds" "$@" > "$log" 2>&1; then
        echo "$name failed or ran past ${seconds} s: see $(basename "$log") in logs.tar.gz"
        tail -n 15 "$log"
        return 1
    fi
    tail -n 4 "$log"
}

"$PY" -c "import torch, triton; print('GPU:', torch.cuda.get_device_name(0), '| torch',
torch.__version__, '| triton', triton.__version__)" | tee "$LOGS/device.txt"
"$PY" -m pip freeze > "$OUT_DIR/image-freeze.txt" 2>&1

if [ ! -d .gpu/wheels ] || [ ! -d .gpu/build ] || [ ! -f "$MODEL/config.json" ]; then
    echo "gpu_check: .gpu/ is missing: run benchmarks/gpu/prepare.sh here and carry .gpu" >&2
    exit 1
fi
run_step "install the carried wheels and Octavo (offline)" 90 "$LOGS/install.log" \
    bash -c "'$PY' -m pip install --no-index --no-deps --no-compile .gpu/wheels/*.whl &&
             '$PY' -m pip install --no-index --find-links .gpu/build --no-deps \
                 -e ./core -e ./plugins/triton -e ./plugins/cuda &&
             '$PY' -m pip check; '$PY' -m octavo --version" || exit 1
run_step "random bf16 weights of the model's shapes" 60 "$LOGS/weights.log" \
    "$PY" benchmarks/gpu_check.py weights "$MODEL" || exit 1

run_step "kernel tests on the GPU" 150 "$LOGS/tests.log" \
    "$PY" -m pytest tests/triton tests/cuda -q -p no:cacheprovider
tail -n 1 "$LOGS/tests.log" | sed 's/=//g' > "$LOGS/tests.summary"

run_step "kernel timings against torch" 90 "$LOGS/kernels.log" \
    "$PY" benchmarks/gpu_check.py times "$LOGS"

bench() {  # bench KIND WORKLOAD LABEL LIMIT [FLAGS...]
    local kind=$1 workload=$2 label=$3 seconds=$4
    shift 4
    run_step "$workload, --backend cuda, $label" "$seconds" "$LOGS/${workload}_$label.log" \
        "$PY" -m octavo bench "$kind" --workload "$workload" --model "$MODEL" \
        --backend cuda "$@" --output-json "$LOGS/${workload}_$label.json"
}
bench throughput W1_throughput graphs 70
bench throughput W1_throughput eager 50 --enforce-eager
bench latency W2_latency graphs 45
bench latency W2_latency eager 35 --enforce-eager
bench latency W2_latency mp 50 --distributed-executor-backend mp
bench latency W2_latency no-async 45 --no-async-scheduling

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)"; then
    bench latency W2_latency tp2 90 -tp 2
    run_step "-dp 2 --enable-expert-parallel, a random Mixtral (NCCL all-to-alls)" 150 \
        "$LOGS/dp_ep.log" bash benchmarks/gpu/dp_ep.sh "$PY" "$MODEL" "$LOGS"
    bench throughput W1_throughput pp2 60 -pp 2 --enable-pipeline-micro-batching
    bench throughput W1_throughput pp2-serial 60 -pp 2 --no-enable-pipeline-micro-batching
else
    echo; echo "== -tp 2, -pp 2 and -dp 2 --enable-expert-parallel skipped: they need two GPUs"
fi

step "summary"
"$PY" benchmarks/gpu_check.py table "$LOGS" | tee "$OUT_DIR/summary.txt"
