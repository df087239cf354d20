"""This node's detached jobs, as ``python3 -m mlenv.runtime jobs``, ``stop``, ``logs``, ``gpus`` and ``stacks`` show
them: the jobs of the host, stopping them (and the standbys), a job's log (every attempt's, one rank's lines, or
followed to its end), the GPUs its ranks run on, and the ranks' stacks."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, cast

from ..forensics import collectives
from ..forensics.culprit import culprit_of
from ..forensics.flightrecorder import flight_dumps
from ..forensics.stacks import group, sample
from ..forensics.stacks import render as render_stacks
from ..node.gpus import read_node, render_node
from ..node.topology import TopologyError, detect_topology, host_name
from ..records.jsonvalue import JsonObject
from ..records.runlayout import NodeDir, read_ranks, runs_root
from ..records.states import NodeEnd, RunState, end_text
from . import standby
from .jobs import POLL_SECONDS, BadInput, JobError, NodeJob, follow_log, host_jobs, next_attempt, stop_jobs


def show_logs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``logs``: this node's log of a detached run (one rank's lines with ``--rank``), earlier attempts first;
    with ``--follow`` through every attempt until the run ends here, then the last attempt's exit status."""
    root, host = args.runs_root or runs_root(environ), host_name(environ)
    deadline = time.monotonic() + (args.wait if args.follow else 0)
    while (job := _node_job(host_jobs(root, host, args.run), environ)) is None:
        if time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        elif args.run:
            raise BadInput(f"no job of {host} in run {args.run} under {root}")
        else:
            raise JobError(f"no job of {host} under {root}")
    out: IO[bytes] = sys.stdout.buffer
    if args.rank is not None:
        known = sorted(rank.rank for rank in read_ranks(job.files))
        if args.rank not in known:
            raise BadInput(f"rank {args.rank} is not on node {job.record.node_rank} of run {job.record.run_id} "
                           f"(its ranks: {', '.join(map(str, known)) or 'none yet'})")
        out = cast(IO[bytes], RankLines(out, job.record.node_rank, args.rank))
    _earlier_attempts(job.files, out)
    if not args.follow:
        with job.files.log.open("rb") as log:
            shutil.copyfileobj(log, out)
        out.flush()
        return 0
    try:
        code = follow_log(job, out)
        while (following := next_attempt(job)) is not None:  # restarted: its next attempt, under its header
            _header(following.files)
            job, code = following, follow_log(following, out)
    except KeyboardInterrupt:
        return 130  # stopped following; the job goes on
    if code is None:
        print(f"mlenv: {job.describe()} is gone without an exit status", file=sys.stderr)
        return 1
    return code


def _earlier_attempts(newest: NodeDir, out: IO[bytes]) -> None:
    """After a restart (attempt > 0): this node's log of every earlier attempt, each under a header naming it, then
    the newest attempt's header (its lines follow)."""
    for attempt in range(newest.attempt + 1) if newest.attempt else ():
        files = NodeDir(newest.run_dir, attempt, newest.node)
        if not files.log.is_file():
            continue
        _header(files)
        if attempt < newest.attempt:
            with files.log.open("rb") as log:
                shutil.copyfileobj(log, out)
            out.flush()


def _header(files: NodeDir) -> None:
    """The line that starts an attempt's log (never filtered out by ``--rank``)."""
    sys.stdout.buffer.write(f"mlenv: ==== attempt {files.attempt} (MLENV_RESTART_COUNT={files.attempt}) of run "
                            f"{files.run_dir.name}, node {files.node} ====\n".encode())
    sys.stdout.buffer.flush()


class RankLines(io.RawIOBase):
    """A writer that passes on only the whole lines of one rank (``[node-R rN] ...``)."""

    def __init__(self, out: IO[bytes], node: int, rank: int) -> None:
        self.out, self.prefix, self.pending = out, f"[node-{node} r{rank}] ".encode(), b""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        *lines, self.pending = (self.pending + bytes(data)).split(b"\n")
        self.out.write(b"".join(line + b"\n" for line in lines if line.startswith(self.prefix)))
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _node_job(jobs: list[NodeJob], environ: Mapping[str, str]) -> NodeJob | None:
    """This node's job in the newest run of ``jobs``: the one of this node's rank when the host has several
    (nodes sharing a machine), else the first."""
    if not jobs:
        return None
    newest = [job for job in jobs if job.files.run_dir == jobs[-1].files.run_dir]
    try:
        rank = detect_topology(environ).node_rank
    except TopologyError:
        return newest[0]
    return next((job for job in newest if job.record.node_rank == rank), newest[0])


def show_jobs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``jobs``: the detached jobs of this host, newest last (``--json``: their records)."""
    root, host = args.runs_root or runs_root(environ), host_name(environ)
    found = host_jobs(root, host)
    if args.json:
        print(json.dumps([job.to_dict() for job in found], indent=2))
    elif not found:
        print(f"no jobs of {host} under {root}")
    else:
        rows = [("RUN", "NODE", "STATE", "PID", "STARTED", "LOG")]
        rows += [(j.record.run_id, str(j.record.node_rank), end_text(NodeEnd(j.state, j.exit_code)), str(j.record.pid),
                  j.record.started_at, str(j.files.log)) for j in found]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        print("".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + f"  {row[-1]}\n"
                      for row in rows), end="")
    return 0


def stop(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``stop``: this host's jobs (of ``--run``) and standbys; 1 where a process outlived SIGKILL."""
    root = args.runs_root or runs_root(environ)
    found = host_jobs(root, host_name(environ), args.run)
    stopped = stop_jobs(found, args.grace)
    standbys = standby.stop(root, args.run)
    if standbys:
        print(f"stopped {standbys} standby{'' if standbys == 1 else 's'} of detached runs")
    if not stopped and not standbys:
        print(_nothing_to_stop(found))
    for result in stopped:
        if result.left:
            print(f"{result.job.describe()}: {result.left} processes still alive after SIGKILL")
        elif result.signal.name == "SIGKILL":
            print(f"stopped {result.job.describe()}: killed with SIGKILL after {args.grace:g} s")
        else:
            print(f"stopped {result.job.describe()}: ended after SIGTERM")
    return 1 if any(result.left for result in stopped) else 0


def _nothing_to_stop(jobs: Sequence[NodeJob]) -> str:
    """``nothing to stop``, naming the newest run here when it has finished (its supervisors ended what it left)."""
    newest = [job for job in jobs if jobs and job.record.run_id == jobs[-1].record.run_id]
    states = sorted({job.state.value for job in newest if job.exit_code is not None})
    return f"run {newest[0].record.run_id} already finished ({', '.join(states)}): nothing to stop" if states \
        else "nothing to stop"


def show_gpus(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``gpus``: this node's GPUs, and which rank of its newest job runs on each."""
    host = host_name(environ)
    job = _node_job(host_jobs(args.runs_root or runs_root(environ), host), environ)
    found = read_node(host, run=job.files if job else None, kmsg=args.kmsg, proc_root=args.proc_root)
    print(json.dumps(found.to_dict()) if args.json else render_node(found), flush=True)
    return 0


def show_stacks(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``stacks``: the stacks of the running ranks of this node's newest job (or ``--run``'s), who among them is
    behind in collective sequence, and its flight recorder dumps."""
    host = host_name(environ)
    job = _node_job(host_jobs(args.runs_root or runs_root(environ), host, args.run), environ)
    stacks: list[JsonObject] = []
    records_read: JsonObject = {}
    if job is None:
        found: dict[str, object] = {"run": None, "host": host}
    else:
        ranks = [r.to_dict() for r in read_ranks(job.files) if r.state is RunState.RUNNING]
        records = job.files.stacks / "collectives"
        token = collectives.ask(records) if ranks else None  # answered while the stacks are taken
        taken = sample(ranks, native=args.native, method=args.method, dumps=job.files.stacks / "faulthandler",
                       workspace=Path.cwd())
        stacks = [stack.to_dict() for stack in taken]
        records_read = {str(rank): record for rank, record in collectives.read(
            records, [int(str(r["rank"])) for r in ranks], token).items()}
        found = {"run": job.record.run_id, "started_at": job.record.started_at, "node": job.record.node_rank,
                 "host": host, "state": job.state, "ranks": stacks, "collectives": records_read,
                 "flight_dumps": [str(path) for path in flight_dumps(job.files.path)]}
    if args.json:
        print(json.dumps(found), flush=True)
    elif job is None:
        print(f"no run of {host}")
    else:
        print(f"collectives (this node's ranks): {culprit_of(stacks, records_read).text}")
        print(render_stacks(group(stacks)))
    return 0
