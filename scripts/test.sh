#!/usr/bin/env bash
# Run the test suite with the virtual environment $VENV (default .venv) on $TEST_WORKERS pytest-xdist workers
# (default 4: on 2 cores, since most tests wait on daemons, rendezvous and timeouts; 0 runs in this process),
# ending with the 15 slowest tests and the seconds per tier (docs/testing.md). Arguments go to pytest (a later
# -n wins). pytest's exit code 5 ("no tests collected") is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
"${VENV:-.venv}/bin/python" -m pytest -n "${TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder --durations=15 "$@"
rc=$?
[ "$rc" = 5 ] && echo "no tests ran" >&2
exit "$rc"
