#!/usr/bin/env bash
# Run the test suite with the virtual environment $VENV (default .venv) on $TEST_WORKERS pytest-xdist workers
# (default 0: in this process; the Makefile's targets say how many they use, docs/testing.md why), ending with
# the 15 slowest tests and the seconds per tier. Arguments go to pytest (a later -n wins). pytest's exit code 5
# ("no tests collected") is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
"${VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-0}" --dist loadgroup --no-loadscope-reorder --durations=15 "$@"
rc=$?
[ "$rc" = 5 ] && echo "no tests ran" >&2
exit "$rc"
