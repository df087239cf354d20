"""``python3 -m mlenv.runtime fault``: a fault put into a run from outside, as ``mlenv drill`` does on a node. The
pids come from the run's own records of this node (``attempt-<K>/node<R>``): the node's share (its supervisor, as
record.json names it, and every process of its cgroup, else its ranks) or one rank (the node's highest global rank).
Prints ``{"signal", "pids", "at"}`` (``at``: the time the signals went, seconds since the epoch)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from ..records.runlayout import NodeDir, attempts, read_json, read_ranks, runs_root
from .jobs import BadInput, JobError

SIGNALS = {"STOP": signal.SIGSTOP, "KILL": signal.SIGKILL, "CONT": signal.SIGCONT}
TARGETS = ("node", "rank")


def inject(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Send ``args.signal`` to ``args.target`` (node or rank) of node ``args.node`` of run ``args.run``."""
    run_dir = (args.runs_root or runs_root(environ)) / args.run
    known = attempts(run_dir)
    if not known:
        raise BadInput(f"no run {args.run} under {run_dir.parent}")
    node = NodeDir(run_dir, known[-1] if args.attempt is None else args.attempt, args.node)
    pids = _share(node) if args.target == "node" else _rank(node)
    if not pids:
        raise JobError(f"nothing of node {args.node} runs in attempt {node.attempt} of run {args.run}")
    at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, SIGNALS[args.signal])
    print(json.dumps({"signal": f"SIG{args.signal}", "pids": pids, "at": at}))
    return 0


def _running_ranks(node: NodeDir) -> list[tuple[int, int]]:
    """(global rank, pid) of the node's ranks still running."""
    return [(rank.rank, rank.pid) for rank in read_ranks(node) if rank.state == "running" and rank.pid > 0]


def _rank(node: NodeDir) -> list[int]:
    ranks = sorted(_running_ranks(node))
    return [ranks[-1][1]] if ranks else []


def _share(node: NodeDir) -> list[int]:
    """The supervisor (while its pid is still the runtime's), its cgroup's processes and its ranks."""
    pids = [pid for _, pid in _running_ranks(node)]
    state = read_json(node.state)
    cgroup = state.get("cgroup") if isinstance(state, dict) else None
    if isinstance(cgroup, str):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(pid) for pid in Path(cgroup, "cgroup.procs").read_text().split()]
    record = read_json(node.record)
    supervisor = record.get("pid") if isinstance(record, dict) else None
    if isinstance(supervisor, int):
        with contextlib.suppress(OSError):
            if b"mlenv.runtime" in Path(f"/proc/{supervisor}/cmdline").read_bytes():
                pids.append(supervisor)
    return sorted(set(pids) - {os.getpid()})
