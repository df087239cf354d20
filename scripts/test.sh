#!/usr/bin/env bash
# Run the test suite with the virtual environment $VENV (default .venv). pytest's exit code 5 ("no tests
# collected") is a failure here too.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
"${VENV:-.venv}/bin/python" -m pytest "$@"
rc=$?
[ "$rc" = 5 ] && echo "no tests ran" >&2
exit "$rc"
