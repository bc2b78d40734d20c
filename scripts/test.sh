#!/usr/bin/env bash
# Installs Octavo, every plugin and the test tools, then runs the whole test suite.
# This is the README's test command and what CI (.ci/run) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --dev
VENV=${VENV:-.venv}
"$VENV/bin/ruff" check core plugins examples tests benchmarks
# The core's layering and the plugins' API boundary (.importlinter); every import counts.
"$VENV/bin/lint-imports" --no-cache
# pytest exits 5 when it collects no test; that must fail CI, and it does: only 0 passes.
# Given arguments, one pytest runs exactly them (after mypy).
if [ $# -gt 0 ]; then
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest "$@"
fi
for top in tests tests/core; do  # tests/core: see SPLIT below
    if compgen -G "$top/test_*.py" >/dev/null; then
        echo "$top/test_*.py: put test files in a folder of $top/ (each runs in its own pytest)" >&2
        exit 1
    fi
done
# Otherwise one pytest per folder of tests/: what a process keeps (models, compiled graphs,
# the allocator's arenas) is freed when it exits, so memory peaks at a folder's, not at the
# sum of all (one process for the whole suite grew past 20 GB of this machine's 24).
#
# The folders run in two lanes at once, because one lane alone kept 1.15 of 2 cores busy on
# average (servers starting, clients waiting on them):
# - the main lane: the folders with time bounds (servers, clusters, soak), at normal priority;
# - the lane beside it, at nice 10 (about a tenth of a CPU the main lane wants): mypy, then
#   folders that compute without time bounds - tests/core, tests/spec_decode and the TPU,
#   Triton and Neuron kernels under their interpreters. The two largest (a subfolder of
#   tests/core peaks near 10 GB, tests/spec_decode near 13 GB) are in this lane, one after
#   the other; a main-lane folder peaks under 2.5 GB (its servers and workers together
#   about 4). The lanes are balanced to end at about the same time: the
#   kernel folders cuda, neuron, rocm and structured moved back beside when tests/e2e grew
#   (at cabaa5d the main lane ran 31.6 min of pytest, the lane beside 24), and tests/bench
#   (no wall-clock bounds; its `alone` tests still run first, by themselves) when
#   tests/parallel grew by the expert-parallel, LoRA, micro-batch and quantized TP tests
#   (at 7085973: main lane 26.6 min, beside 22.9, before those ~6 min of new tests); and
#   back to the main lane when the lane beside became the longer (at 72afdc1: main 21.9 min,
#   beside 26.5 plus mypy, tests/bench 4.7 of it); cuda, rocm and structured (84 s) to the
#   main lane again when tests/core split by subfolder (at 9c6eb4e, on the AMD EPYC guest:
#   main lane 28.4 min, beside about 30).
# OpenMP's threads sleep when they wait instead of spinning (OMP_WAIT_POLICY=PASSIVE): with
# two lanes on two cores, a spinning thread takes the core another process needs (the first
# two-lane run spent 3,290 s of CPU where one lane had spent 2,545).
# Tests marked `alone` (in tests/bench) measure the whole machine's load: they run first,
# with nothing beside them. Tests marked `timed` (a wall-clock bound) in the lane beside
# run in the main lane, at its end.
# A new folder runs in the main lane until it is named below.
BESIDE=" tests/core tests/spec_decode tests/tpu tests/triton tests/neuron "
# tests/core runs one pytest per subfolder: in one process it grew past 18 GB (a module's
# engines and models, and what the heaps kept of them) and the kernel killed it for memory,
# with the main lane's servers and workers beside it; a subfolder peaks under 8 GB.
SPLIT=" tests/core "
ENGINE_TESTS=tests/core/engine
export OMP_WAIT_POLICY=PASSIVE
logs=$(mktemp -d)
fail() { echo "$1" >> "$logs/failed"; }
parts() {  # the folders of the lane beside, each as the pytest runs it takes: one, or its subfolders
    local folder
    for folder in $BESIDE; do
        [ -d "$folder" ] || continue
        if [[ "$SPLIT" == *" $folder "* ]]; then
            find "$folder" -mindepth 1 -maxdepth 1 -type d -not -name '__pycache__' | sort
        else
            echo "$folder"
        fi
    done
}
pytest_in() {  # marker expression, folders or files...: one pytest; a failure is noted
    local marks=$1
    shift
    "$VENV/bin/python" -m pytest -m "$marks" "$@" || fail "$* -m '$marks' (exit $?)"
}
echo "=== pytest -m alone tests/bench"
pytest_in alone tests/bench
(
    renice -n 10 -p "$BASHPID" > /dev/null  # this lane and every process it starts
    "$VENV/bin/mypy" || fail "mypy (exit $?)"
    for folder in $(parts); do
        [ -n "$(find "$folder" -name 'test_*.py' -print -quit)" ] || continue
        pytest_in "not alone and not timed" "$folder" > "$logs/${folder//\//_}.log" 2>&1
        echo "=== pytest $folder ended beside (its log follows the main lane's)"
    done
    # Async scheduling is on by default where it runs; the engine tests run once more with
    # it off (tests/conftest.py), so one step at a time stays tested (about 210 s).
    pytest_in "not alone and not timed" --async-scheduling=off "$ENGINE_TESTS" \
        > "$logs/async-off.log" 2>&1
    echo "=== pytest $ENGINE_TESTS --async-scheduling=off ended beside"
) &
beside=$!
for folder in tests/*/; do
    folder=${folder%/}
    [ -n "$(find "$folder" -name 'test_*.py' -print -quit)" ] || continue
    [[ "$BESIDE" == *" $folder "* ]] && continue
    echo "=== pytest $folder"
    pytest_in "not alone" "$folder"
done
# shellcheck disable=SC2086
timed=$(grep -rl --include='test_*.py' "pytest.mark.timed" $BESIDE || true)
if [ -n "$timed" ]; then
    echo "=== pytest -m timed, from the folders beside"
    # shellcheck disable=SC2086
    pytest_in timed $timed
fi
wait "$beside"
for folder in $(parts); do
    if [ -f "$logs/${folder//\//_}.log" ]; then
        echo "=== pytest $folder (ran beside)"
        cat "$logs/${folder//\//_}.log"
    fi
done
if [ -f "$logs/async-off.log" ]; then
    echo "=== pytest $ENGINE_TESTS --async-scheduling=off (ran beside)"
    cat "$logs/async-off.log"
fi
if [ -f "$logs/failed" ]; then
    echo "FAILED: $(tr '\n' ' ' < "$logs/failed")" >&2
    exit 1
fi
echo "every folder of tests/ passed, and mypy"
