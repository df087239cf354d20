#!/usr/bin/env bash
# Start a DeepSpeed job on this node; run it on every node (`mlenv launch` does that for you).
#
#   ./launch_deepspeed.sh [SCRIPT [ARGS...]]      default SCRIPT: train_multi_node.py
#
# Rank, node count and master come from the environment (see `python3 -m mlenv.runtime topology`);
# NCCL is configured from this machine's devices before DeepSpeed starts, in no-ssh mode.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="${1:-${here}/train_multi_node.py}"
shift || true
export PYTHONPATH="${here}/.mlenv${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m mlenv.runtime launch --launcher deepspeed -- "${script}" "$@"
