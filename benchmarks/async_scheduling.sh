#!/usr/bin/env bash
# Async scheduling (issue 47) side by side: `octavo bench sweep` bf16 at B = 1..8 and the
# W2_latency workload, each with --async-scheduling off and on, on the default model.
# Run on an idle machine (the load average is printed before each run); results and JSON
# go to ${OUT:-async-scheduling-results}/. SMALL=1 runs a short version (fewer steps and
# iterations) that only shows the commands work.
set -euo pipefail
cd "$(dirname "$0")/.."
OCTAVO=${OCTAVO:-.venv/bin/octavo}
OUT=${OUT:-async-scheduling-results}
mkdir -p "$OUT"
if [ "${SMALL:-0}" = 1 ]; then
    SWEEP=(--max-batch-size 8 --context-len 64 --steps 8 --num-iters-warmup 1 --num-iters 1)
    W2=(--num-iters-warmup 0 --num-iters 1 --output-len 16)
else
    SWEEP=(--max-batch-size 8 --context-len 256 --steps 32 --num-iters 5)
    W2=()
fi
for mode in off on; do
    flags=(--async-scheduling)  # on by default; named both ways so the JSON says which
    [ "$mode" = off ] && flags=(--no-async-scheduling)
    echo "=== bench sweep bf16, async scheduling $mode (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$OCTAVO" bench sweep --dtype bfloat16 "${SWEEP[@]}" "${flags[@]}" \
        --label "async scheduling $mode" --output-json "$OUT/sweep-$mode.json"
    echo "=== bench latency W2_latency, async scheduling $mode (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$OCTAVO" bench latency --workload W2_latency "${W2[@]}" "${flags[@]}" \
        --output-json "$OUT/w2-$mode.json"
done
