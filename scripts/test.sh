#!/usr/bin/env bash
# Run the test suite with the virtual environment $VENV (default .venv) on $TEST_WORKERS pytest-xdist workers
# (default 0: in this process; the Makefile's targets say how many they use, docs/testing.md why), each run ending
# with the 15 slowest tests and the seconds per tier. Arguments go to pytest (a later -n wins). With workers, the
# tests marked `timing` (they judge which rank is slower) run afterwards in one process with nothing beside them:
# two runs, a summary each. pytest's exit code 5 ("no tests collected") is a failure, unless only the second run
# found none.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
workers="${TEST_WORKERS:-0}"
pytest=("${VENV:-.venv}/bin/python" -m pytest --dist loadgroup --no-loadscope-reorder --durations=15)
if [ "$workers" = 0 ]; then
    "${pytest[@]}" -n 0 "$@"
    rc=$?
else
    TEST_PHASE=parallel "${pytest[@]}" -n "$workers" "$@"
    rc=$?
    TEST_PHASE=timing "${pytest[@]}" -n 0 "$@"
    alone=$?
    [ "$alone" = 5 ] && alone=0
    [ "$rc" = 0 ] && rc=$alone
fi
[ "$rc" = 5 ] && echo "no tests ran" >&2
exit "$rc"
