"""``status``'s ``latest_run`` from what each node's supervisor recorded of a run (docs/runs.md), however a backend
reads the records (the runtime's ``jobs --json`` on every node, or the shared run directory on Slurm): one place,
so every backend answers the same shape."""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from typing import Any

from mlenv.runtime.records.runlayout import FirstFailure, RankRecord, parse_ranks
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import (
    ENDED,
    Ending,
    FaultSign,
    NodeEnd,
    NodeFault,
    RunState,
    exit_state,
    parse_faults,
    run_state,
)
from mlenv.runtime.records.timeline import NodeAttempt

NodeJob = Mapping[str, Any]
"""One node's share of a run in the shape of an entry of the runtime's ``jobs --json``: ``state``, ``exit_code``,
``attempt``, ``ranks``, ``first_failure``, ``transport``, ``stacks``, ``idle``, ``stragglers``, ``node_fault``,
``lost_nodes`` (node 0's: the nodes it lost, each with its ``unreachable`` sign) and ``attempts`` (the node's share
of each attempt, runtime/records/timeline.py)."""


def node_state(job: NodeJob | None, ordinal: int | None = None, first: FirstFailure | None = None,
               lost: Mapping[int, NodeFault] | None = None) -> NodeEnd | None:
    """A node's entry of ``run_states``: its state, with the exit code once it ended (128+N for a signal N); None
    where nothing is known of it. A node ``ordinal`` that ended failed for the ``first`` failure of another node,
    with no fault of its own, was stopped for it (fail-fast): ``stopped (143)``, as mlenv's SIGTERM stopped it,
    whichever came first there (the failure's news, which its supervisor records with the job's exit code, or the
    launch's own stop). Where another node was ``lost`` (:func:`lost_in_attempt`) and none failed first, such a
    node stopped for that loss (its own exit code kept), and the lost node itself, whose record still reads running
    (frozen), failed, as did one lost to silence whatever it recorded once thawed (the stop that followed); one
    whose record cannot be read (its machine gone) is unknown here: the run still failed."""
    lost = lost or {}
    state = RunState.parse(job.get("state")) if job is not None else None
    if job is None or state is None:
        return None
    code = job.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    sign = lost.get(ordinal) if ordinal is not None else None
    if sign is not None and (state is RunState.RUNNING or (state is not RunState.SUCCEEDED and not sign.closed)):
        return NodeEnd(RunState.FAILED, code)
    healthy = ordinal is not None and code is not None and NodeFault.parse(job.get("node_fault")) is None
    if state is RunState.FAILED and healthy and first is not None and ordinal != first.node:
        return NodeEnd(RunState.STOPPED, STOPPED_BY_MLENV)
    if state is RunState.FAILED and healthy and first is None and set(lost) - {ordinal}:
        return NodeEnd(exit_state(code, Ending.COLLATERAL), code)
    return NodeEnd(state, code)


def lost_in_attempt(jobs: Mapping[int, NodeJob | None]) -> dict[int, NodeFault]:
    """The nodes another node recorded lost (``lost_nodes``: to silence, as a frozen node records nothing of it, or
    as its connection closed) in the attempt that the lost node's newest share belongs to, or that has no share to
    read (its machine gone), each with its sign (a silence over a closed connection)."""
    found: dict[int, NodeFault] = {}
    for recorder, lost in _losses(jobs).items():
        attempt = (jobs.get(recorder) or {}).get("attempt", 0)
        for node, fault in lost.items():
            if ((share := jobs.get(node)) is None or share.get("attempt", 0) == attempt) \
                    and (node not in found or found[node].closed):
                found[node] = fault
    return found


def latest_run(run_id: str, jobs: Mapping[int, NodeJob | None]) -> RunRecord:
    """Run ``run_id`` from its nodes' shares (node ordinal -> share, None where the node has none), read once into a
    typed record (its ``to_dict`` is ``status --json``'s ``latest_run``): the ranks of every node, the first failure
    (the same on every node), each node's transport verdict, the hang watchdog's stacks (node 0's), each node's idle
    GPUs while the job is flagged idle, the stragglers (node 0's), each node's own fault sign
    (runtime/watch/faultsigns.py) and each node's state, how and when it ended (``ended``), how many attempts were
    preempted, and its goodput (from the start of its first node; ``RunRecord.launched`` counts its time queued)."""
    known = [job for job in jobs.values() if job is not None]
    failures = [job["first_failure"] for job in known if job.get("first_failure")]
    first = FirstFailure.parse(failures[0]) if failures else None
    ranks = tuple(sorted((rank for job in known for rank in parse_ranks(job.get("ranks"))), key=lambda r: r.rank))
    lost = lost_in_attempt(jobs)
    states = {ordinal: node_state(job, ordinal, first, lost) for ordinal, job in jobs.items()}
    lost_failed = {ordinal for ordinal, end in states.items() if ordinal in lost and end is not None
                   and end.state is RunState.FAILED}  # frozen, or thawed and stopped: failed
    state = run_state([*(RunState.FAILED if ordinal in lost_failed else RunState.parse(job.get("state"))
                         for ordinal, job in jobs.items() if job is not None),
                       *(RunState.FAILED for ordinal in lost if jobs.get(ordinal) is None)])  # gone unread
    code, ended_at = ended(state, first, {ordinal: job for ordinal, job in jobs.items() if job is not None}, ranks)
    timeline = tuple(share for job in known for item in job.get("attempts") or ()
                     if (share := NodeAttempt.parse(item)) is not None)
    newest = max((share.attempt for share in timeline), default=0)
    return RunRecord(
        run_id, state,
        max((int(job.get("attempt", 0)) for job in known), default=0),
        ranks, first,
        {f"node-{ordinal}": job["transport"] for ordinal, job in sorted(jobs.items())
         if job is not None and job.get("transport")},
        next((job["stacks"] for job in known if job.get("stacks")), None),
        {f"node-{ordinal}": job["idle"] for ordinal, job in sorted(jobs.items())
         if job is not None and job.get("idle")} or None,
        next((list(job["stragglers"]) for job in known if isinstance(job.get("stragglers"), list)), None),
        node_faults(jobs),
        states, exit_code=code,
        ended_at=ended_at, timeline=timeline,
        preemptions=len({share.attempt for share in timeline
                         if share.state == RunState.PREEMPTED and share.attempt < newest}),
    ).launched(None, time.time())


STOPPED_BY_MLENV = 128 + signal.SIGTERM
"""How a node stopped for another node's failure ended: mlenv's fail-fast stop is a SIGTERM (exit codes 128+N)."""


def ended(state: RunState | None, first: FirstFailure | None, jobs: Mapping[int, NodeJob],
          ranks: tuple[RankRecord, ...]) -> tuple[int | None, str | None]:
    """How a run in ``state`` ended: its exit code (the node that failed ``first``'s, else the first other node's
    that is not 0, else 0) and when its last rank did; (None, None) while it has not (a node still runs)."""
    if state not in ENDED or any(job.get("state") == RunState.RUNNING for job in jobs.values()):
        return None, None
    numbers = {ordinal: job["exit_code"] for ordinal, job in sorted(jobs.items())
               if isinstance(job.get("exit_code"), int)}
    if first is not None and first.node in numbers:
        code: int | None = numbers[first.node]
    else:
        code = next((number for number in numbers.values() if number), 0 if numbers else None)
    times = [rank.ended_at for rank in ranks if rank.ended_at]
    return code, max(times) if times and len(times) == len(ranks) else None


def node_faults(jobs: Mapping[int, NodeJob | None]) -> dict[int, NodeFault]:
    """Each node's own fault sign; for a node without one that node 0 lost (``lost_nodes``: to silence, as a frozen
    node records nothing, or as its connection closed), node 0's ``unreachable`` sign (over the node's own
    ``unreachable`` too, but for a closed connection: the node's own record says more of a supervisor that is
    gone)."""
    own = {ordinal: fault for ordinal, job in sorted(jobs.items())
           if job is not None and (fault := NodeFault.parse(job.get("node_fault"))) is not None}
    lost = {node: fault for losses in _losses(jobs).values() for node, fault in losses.items()}
    return {**own, **{node: fault for node, fault in lost.items()
                      if node not in own or (own[node].sign is FaultSign.UNREACHABLE and not fault.closed)}}


def _losses(jobs: Mapping[int, NodeJob | None]) -> dict[int, dict[int, NodeFault]]:
    """Node -> the nodes it recorded lost (``lost_nodes``), less a closed connection of a node that had lost it to
    silence: that node closed because it stopped for the loss (node 1 stops for a frozen node 0; node 0, thawed by
    the stop that follows, finds node 1's connection closed), and is no culprit."""
    recorded = {ordinal: _lost_nodes(job) for ordinal, job in jobs.items() if job is not None}
    return {recorder: {node: fault for node, fault in lost.items()
                       if not (fault.closed and (theirs := recorded.get(node, {}).get(recorder)) is not None
                               and not theirs.closed)}
            for recorder, lost in recorded.items()}


def _lost_nodes(job: NodeJob) -> dict[int, NodeFault]:
    """The nodes node 0 lost, as its share records them (``lost_nodes``: node -> its sign; before the signs were
    typed, node -> node 0's words, read as a silence's ``unreachable``)."""
    recorded = job.get("lost_nodes")
    if not isinstance(recorded, Mapping):
        return {}
    older = {int(node): NodeFault(FaultSign.UNREACHABLE, why) for node, why in recorded.items()
             if str(node).isdigit() and isinstance(why, str)}
    return {**older, **parse_faults(recorded)}
