"""The training job of ``mlenv drill``, shipped with the runtime (``.mlenv/mlenv/runtime/drilljob.py`` in every
node's workspace: none of the user's files) and run as a script, never imported by mlenv; torch is imported when it
runs (the runtime itself stays standard library only). A few numbers all-reduced over gloo each step; the step
checkpointed under ``MLENV_CHECKPOINT_DIR`` by each node's local rank 0 after every step (one small JSON file,
written atomically through a temporary file of the node's own: nodes may share the directory), resumed from the
newest on the next attempt. Rank 0 prints ``drill: attempt K resumed at step S t=EPOCH`` once and ``step N/TOTAL
t=EPOCH`` after each step. With ``--exit-at N`` the highest global rank exits 1 at step N of attempt 0 (the drill's
rank-exit). With ``--checkpoint-on-signal`` (the drill's preemption), on the checkpoint signal
(``MLENV_CHECKPOINT_SIGNAL``) each node's local rank 0 checkpoints the last step done and prints ``drill: node N
checkpointed step S after SIGNAL t=EPOCH``, and its ranks end: 143 after SIGTERM (as a stop), 0 after another
(Slurm's warning: the attempt is done, the job requeues itself); without, the signal ends a rank at once, as it
ends one that never handles it."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SIGNAL_LAG = 1.0
"""How long a rank whose peer left waits for its own checkpoint signal (a preemption reaches a node's ranks at about
the same time) before it takes the peer's leaving for a failure."""


def main() -> int:
    """Train ``--steps`` steps from the checkpoint's, ``--step-seconds`` each."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--exit-at", type=int, default=-1)
    parser.add_argument("--checkpoint-on-signal", action="store_true")
    args = parser.parse_args()
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("MLENV_RESTART_COUNT") or 0)
    checkpoint = Path(os.environ.get("MLENV_CHECKPOINT_DIR") or "checkpoints/drill") / "drill.json"
    found = torch.tensor([int(json.loads(checkpoint.read_text())["step"]) if checkpoint.exists() else 0])
    dist.all_reduce(found, op=dist.ReduceOp.MAX)  # a node without the checkpoint (a new one) starts with the rest
    start = int(found.item())
    if rank == 0:
        print(f"drill: attempt {attempt} resumed at step {start} t={time.time():.3f}", flush=True)
    warned = _warned_by(os.environ.get("MLENV_CHECKPOINT_SIGNAL") if args.checkpoint_on_signal else None)
    weights, done = torch.zeros(4), start
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_seconds)
        if warned:
            return _checkpointed(checkpoint, done, weights, warned[0])
        if step == args.exit_at and attempt == 0 and rank == world - 1:
            print(f"drill: rank {rank} exits with 1 at step {step} t={time.time():.3f}", flush=True)
            return 1
        grad = torch.ones(4)
        try:
            dist.all_reduce(grad)
        except RuntimeError:  # a peer left: preempted with this node (its signal is on the way here too), or failed
            if args.checkpoint_on_signal and _arrives(warned, SIGNAL_LAG):
                return _checkpointed(checkpoint, done, weights, warned[0])
            raise
        weights += grad / world
        done = step
        _save(checkpoint, step, weights)
        if rank == 0:
            print(f"step {step}/{args.steps} t={time.time():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _warned_by(name: str | None) -> list[str]:
    """The checkpoint signals received (by name) since now: the list fills when ``name``'s signal arrives."""
    warned: list[str] = []
    if name:
        signal.signal(getattr(signal, name), lambda signum, _: warned.append(signal.Signals(signum).name))
    return warned


def _arrives(warned: list[str], within: float) -> bool:
    """Whether the checkpoint signal is (or comes) in ``warned`` within ``within`` seconds."""
    until = time.monotonic() + within
    while not warned and time.monotonic() < until:
        time.sleep(0.05)
    return bool(warned)


def _node() -> str:
    """This rank's node: torchrun's GROUP_RANK, else mlenv's MLENV_NODE_RANK."""
    return os.environ.get("GROUP_RANK") or os.environ.get("MLENV_NODE_RANK") or "0"


def _save(checkpoint: Path, step: int, weights: Any) -> None:
    """Checkpoint ``step`` (by the node's local rank 0): every node keeps one, a workspace need not be shared."""
    if os.environ.get("LOCAL_RANK") == "0":
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        partial = checkpoint.with_name(f".drill.json.{_node()}")
        partial.write_text(json.dumps({"step": step, "weights": weights.tolist()}))
        partial.replace(checkpoint)


def _checkpointed(checkpoint: Path, step: int, weights: Any, name: str) -> int:
    """Checkpoint the last step done on the checkpoint signal ``name``, say so (local rank 0); the exit code."""
    _save(checkpoint, step, weights)
    if os.environ.get("LOCAL_RANK") == "0":
        print(f"drill: node {_node()} checkpointed step {step} after {name} t={time.time():.3f}", flush=True)
    return 143 if name == "SIGTERM" else 0


if __name__ == "__main__":
    sys.exit(main())
