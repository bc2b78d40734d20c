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
# Types of the core and every plugin (the files mypy.ini names).
"$VENV/bin/mypy"
# pytest exits 5 when it collects no test; that must fail CI, and it does: only 0 passes.
# Given arguments, one pytest runs exactly them. Otherwise one pytest per folder of tests/:
# what a process keeps (models, compiled graphs, the allocator's arenas) is freed when it
# exits, so the suite's memory peaks at its largest folder's, not at the sum of all (one
# process for the whole suite grew past 20 GB of this machine's 24).
if [ $# -gt 0 ]; then
    exec "$VENV/bin/python" -m pytest "$@"
fi
if compgen -G "tests/test_*.py" >/dev/null; then
    echo "tests/test_*.py: put test files in a folder of tests/ (each runs in its own pytest)" >&2
    exit 1
fi
failed=()
for folder in tests/*/; do
    [ -n "$(find "$folder" -name 'test_*.py' -print -quit)" ] || continue
    echo "=== pytest ${folder%/}"
    "$VENV/bin/python" -m pytest "${folder%/}" || failed+=("${folder%/} (exit $?)")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "every folder of tests/ passed"
