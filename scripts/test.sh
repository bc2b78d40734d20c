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
"$VENV/bin/python" -m pytest "$@"
