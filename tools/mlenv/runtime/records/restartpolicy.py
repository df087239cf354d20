"""The restart policy, in one place: after an attempt of a run failed, whether the run starts again, which nodes are
left out of it (and whether that is recorded for later runs) and which standby takes a left-out node's place.

Everyone who restarts a run asks this module: mlenv for an attached run (ops/launch.py), the nodes' supervisors for
a detached one (runtime/supervise/detached.py), and the runtime that runs a Slurm run's attempts
(runtime/supervise/slurmsteps.py). The rules (docs/runs.md, "Restarts"):

1. A run is started again only while ``--max-restarts`` allows, and never after a success, a stop by the user
   (states.py's :data:`STOP_CODES`: Ctrl-C, ``mlenv stop``, scancel) or an idle stop (``--on-idle stop``: it would
   idle again).
   A stop's exit code where a node was lost to the infrastructure (:data:`LOST_SIGNS`: the scheduler's node failure,
   drain or reclaim delivers SIGTERM too) is no user's stop: such a run is restarted.
2. A node whose failure carries a node-fault sign (:data:`SIGNS`: unreachable, lost to a node failure, an NCCL network
   error, a GPU Xid or ECC event, a failed in-node check) is left out of the next attempts at once, and recorded on
   the deployment (``mlenv nodes``), so that later runs leave it out too.
3. A user's bug is not a node fault: a failure without a sign that repeats the previous attempt's (the same global
   rank, exit code or signal, and :data:`LAST_LINES` last lines) stops the restarts ("the same error in attempts 1
   and 2: not restarting", counting attempts from 1); no node is left out and no spare or standby is spent.
4. A node that failed first, without a sign, in :data:`FAULTY_AFTER` attempts of the run is left out of the rest of
   that run only: never recorded on the deployment (a script's failures land on whichever node its rank ran on).
5. A left-out node's work goes to a spare: attached, the backend places it (core/spares.py); detached, the run's next
   unused standby (:func:`standby_for`), never for node 0, which holds the rendezvous (a detached run whose node 0
   the other nodes lost, frozen or cut off, is not restarted: :data:`RENDEZVOUS_LOST`); on Kubernetes with
   ``scheduling.move_faulty_pods``, the pods themselves, kept off the node's machine and made again
   (supervise/kubemove.py), node 0's as well (its name, the rendezvous, moves with it).
6. A preemption (a pod of the run deleted or evicted) is no failure: a detached run resumes as its next attempt
   (:func:`resumes`), up to ``--max-preemptions`` times, apart from ``--max-restarts``; mlenv resumes an attached one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .runlayout import PREEMPTED_MARK, FirstFailure, NodeDir, read_state
from .states import (
    ENDED,
    STOP_CODES,
    Ending,
    FaultSign,
    LeftOut,
    NodeFault,
    RunState,
    exit_state,
    parse_faults,
    run_state,
)

SIGNS = {
    FaultSign.UNREACHABLE: "unreachable",
    FaultSign.NODE_FAILURE: "node failure",
    FaultSign.NCCL_NET: "NCCL network error",
    FaultSign.XID: "GPU Xid event",
    FaultSign.ECC: "GPU ECC errors",
    FaultSign.NODE_CHECK: "in-node check failed",
    FaultSign.STRAGGLER: "straggler",
}
"""How every node-fault sign reads (states.py's :class:`FaultSign`; runtime/watch/faultsigns.py detects ``nccl-net``,
``xid``, ``ecc`` and ``node-check`` on the node)."""
IDLE_EXIT_CODE = 125
"""What ``--on-idle stop`` exits with (watch/idle.py): the code after the hang stop's 124, used by nothing else of
mlenv; never restarted (an idle job would idle again)."""
FAULTY_AFTER = 2
"""A node that failed first (without a sign) in this many attempts of a run is left out of the rest of the run."""
LOST_SIGNS = frozenset({FaultSign.UNREACHABLE, FaultSign.NODE_FAILURE})
"""The signs of a node lost to the infrastructure: a stop of the job then is not the user's."""
FINAL_CODES = frozenset({0, IDLE_EXIT_CODE, *STOP_CODES})
"""Exit codes of an attempt that is never run again: success, an idle stop, a stop by the user."""

FAILED_FIRST = "MLENV_FAILED_FIRST"
"""In a detached run's restarted attempts: who failed first in each earlier attempt (:func:`failed_first`),
comma-joined in attempt order (empty where nothing did)."""
LAST_ERROR = "MLENV_LAST_ERROR"
"""In a detached run's restarted attempts: the previous attempt's error (:func:`error_of`; empty: none, or a sign)."""


def final(exit_code: int) -> bool:
    """Whether an attempt that ended with ``exit_code`` is never run again (rule 1)."""
    return exit_code in FINAL_CODES


def may_restart(exit_code: int, attempt: int, max_restarts: int, signs: Iterable[NodeFault] = ()) -> bool:
    """Whether attempt ``attempt`` (0 for the first), ended with ``exit_code``, may be followed by another; ``signs``:
    the nodes' own node-fault signs (a node :data:`LOST_SIGNS` makes a stop's exit code restartable)."""
    lost = exit_code in STOP_CODES and any(sign.sign in LOST_SIGNS for sign in signs)
    return (lost or not final(exit_code)) and attempt < max_restarts


def resumes(state: object, preemptions: int, max_preemptions: int | None, environ: Mapping[str, str]) -> bool:
    """Whether this node's share of a detached attempt that ended in ``state`` starts again as the next attempt
    (rule 6): a preemption, within ``max_preemptions`` (None: every time; ``preemptions``: this one counted), on a
    node whose own pod stays (its PID 1 marked nothing). The pod taken away resumes its share once it is back (its
    PID 1 runs the runtime's ``resume``)."""
    mark = environ.get(PREEMPTED_MARK)
    return (state == RunState.PREEMPTED and bool(mark) and not Path(str(mark)).exists()
            and (max_preemptions is None or preemptions <= max_preemptions))


def why_faulty(fault: NodeFault) -> str:
    """How a recorded sign reads: ``NCCL network error: <the line>``."""
    return f"{SIGNS[fault.sign]}: {fault.evidence}"


def failed_first(first: FirstFailure | None) -> str:
    """Who failed first, as an attempt's recorded first failure names it: its host, else ``node-N`` (an older
    record); empty when nothing failed first."""
    return "" if first is None else first.host or f"node-{first.node}"


LAST_LINES = 2
"""How many of a failing rank's last (non-empty) lines make its error: a traceback's failing source line and its
exception line; not the frame's line above them, whose path differs where nodes hold the script at different
paths, nor earlier lines (a step counter may differ in every attempt)."""


def error_of(first: FirstFailure | None) -> str:
    """A short key of a recorded first failure's error (its rank, exit code, signal and :data:`LAST_LINES` last
    lines), equal for the same error in two attempts; empty when nothing failed first or the failure carries a
    node-fault sign."""
    if first is None or first.node_fault is not None:
        return ""
    lines = [line.strip() for line in first.log_tail if line.strip()]
    seen = [first.rank, first.exit_code, first.signal, lines[-LAST_LINES:]]
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class History:
    """What a run's earlier attempts leave the policy: who failed first in each (:func:`failed_first`, empty where
    nothing did) and the previous attempt's error (:func:`error_of`)."""

    failed_first: tuple[str, ...] = ()
    last_error: str = ""

    @classmethod
    def of(cls, environ: Mapping[str, str], attempt: int) -> History:
        """The history that attempt ``attempt`` of a detached run carries in its environment."""
        if not attempt:
            return cls()
        return cls(tuple(environ.get(FAILED_FIRST, "").split(",")[:attempt]), environ.get(LAST_ERROR, ""))

    def after(self, who: str, error: str) -> History:
        """This history with one more attempt, ``who`` failed first in it with ``error``."""
        return History((*self.failed_first, who), error)

    def environ(self) -> dict[str, str]:
        """The variables that hand this history to the next attempt (:meth:`of` reads them)."""
        return {FAILED_FIRST: ",".join(self.failed_first), LAST_ERROR: self.last_error}


def run_only(count: int) -> str:
    """Why a node that failed first in ``count`` attempts of the run is left out of the rest of it only (rule 4)."""
    return f"it failed first in {count} attempts of the run"


@dataclass(frozen=True)
class Verdict:
    """What follows a failed attempt that may be restarted (``may_restart``)."""

    history: History
    """The run's history with this attempt, for the next one."""
    left_out: tuple[LeftOut, ...] = ()
    stop: str | None = None
    """Why the run is not restarted although restarts are left (rule 3); None: it is, without ``left_out``."""


def judge(attempt: int, history: History, first: FirstFailure | None, node: int | None = None,
          host: str | None = None, signs: Mapping[int, NodeFault] | None = None) -> Verdict:
    """The verdict on failed attempt ``attempt`` (0 for the first) of a run with ``history``: ``first`` is its recorded
    first failure (None where nothing failed first, or no record was kept); ``node`` the node that failed first
    (default: ``first``'s; None: none did) and ``host`` the host it ran on (default: :func:`failed_first`);
    ``signs`` the nodes' own node-fault signs (a lost supervisor, a failed in-node check, an unreachable node)."""
    if node is None and first is not None:
        node = first.node
    who = "" if node is None else host or failed_first(first) or f"node-{node}"
    found = dict(signs or {})
    if node is not None and first is not None and first.node_fault is not None:
        found.setdefault(node, first.node_fault)
    error = error_of(first) if node is not None and node not in found else ""
    following = history.after(who, error)
    left = [LeftOut(faulty, why_faulty(sign), saved=True) for faulty, sign in sorted(found.items())]
    if node is not None and node not in found:
        if not found and error and error == history.last_error:
            said = f"rank {first.rank} (node-{node}) {first.reason}: " if first is not None else ""
            return Verdict(following, stop=f"{said}the same error in attempts {attempt} and {attempt + 1}: not "
                                           "restarting (a bug in the script is not a node fault: no node is left out)")
        count = following.failed_first.count(who)
        if count >= FAULTY_AFTER:
            left.append(LeftOut(node, run_only(count), saved=False))
    return Verdict(following, tuple(left))


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt of a run ended: the facts every restart loop hands the policy (:func:`decide`), alike."""

    exit_code: int
    attempt: int
    """The attempt it was (0 for the first)."""
    first: FirstFailure | None = None
    """Its recorded first failure (None where nothing failed first, or no record was kept)."""
    node: int | None = None
    """The node that failed first (default: ``first``'s; None: none did)."""
    host: str | None = None
    """The host ``node`` ran on (default: :func:`failed_first`)."""
    signs: Mapping[int, NodeFault] = field(default_factory=dict)
    """The nodes' own node-fault signs, as the attempt's records hold them."""
    lost: Mapping[int, NodeFault] = field(default_factory=dict)
    """The nodes lost meanwhile (to the scheduler, to silence): their signs count as the nodes' own."""
    restarts: int | None = None
    """The restarts ``--max-restarts`` counts so far (None: ``attempt``; preemptions are not counted)."""
    final: bool = False
    """Never run again, whatever the policy would say (stopped, warned, not the policy's to judge)."""

    def faults(self) -> dict[int, NodeFault]:
        """The node-fault signs of the attempt: the nodes' own, then those of the nodes lost."""
        found = dict(self.signs)
        for node, fault in sorted(self.lost.items()):
            found.setdefault(node, fault)
        return found

    def judged(self, history: History) -> Verdict:
        """The policy's verdict on this failed attempt of a run with ``history`` (:func:`judge`)."""
        return judge(self.attempt, history, self.first, self.node, self.host, self.faults())


def decide(end: AttemptEnd, max_restarts: int, history: History) -> Verdict | None:
    """The verdict on attempt ``end`` of a run with ``history``; None where it is not run again (rules 1: final,
    a stop, no restarts left)."""
    restarts = end.attempt if end.restarts is None else end.restarts
    if end.final or not may_restart(end.exit_code, restarts, max_restarts, end.faults().values()):
        return None
    return end.judged(history)


@dataclass(frozen=True)
class ScriptEnd:
    """How an attempt of a Slurm run ended, read from its records (:func:`for_script`)."""

    end: AttemptEnd
    ended: RunState
    """How the attempt ended (:func:`attempt_end`; ``requeued`` where the job is requeued), for its directory."""
    lost: str
    """Who the scheduler lost, and why; empty where it lost none."""
    requeue: bool
    """The scheduler's warning came and the job may be requeued."""


def for_script(run_dir: Path, attempt: int, exit_code: int, hosts: Sequence[str], failed_file: Path | None,
               warned: bool = False, lost: Mapping[int, NodeFault] | None = None, requeues: int = 0,
               requeued: int = 0) -> ScriptEnd:
    """Attempt ``attempt`` of a Slurm run (supervise/slurmsteps.py asks), from the attempt's records in ``run_dir``
    and its ``hosts`` in node order: the node that failed first and its exit code (node 0's recorded first failure,
    else ``failed_file``'s ``<node> <code>``; else none and ``exit_code``), the nodes' signs and those of the nodes
    the scheduler ``lost``; final where the scheduler's warning came (``warned``); requeued where the job,
    ``requeued`` times so far, may be requeued ``requeues`` times."""
    shares = [read_state(NodeDir(run_dir, attempt, rank)) for rank in range(max(len(hosts), 1))]
    first = FirstFailure.parse(shares[0].get("first_failure"))
    node, code = (first.node, first.exit_code) if first is not None else (None, exit_code)
    found = failed_file.read_text().split() if first is None and failed_file and failed_file.is_file() else []
    if len(found) == 2 and all(word.isdigit() for word in found):
        node, code = int(found[0]), int(found[1])
    signs = {rank: fault for rank, share in enumerate(shares) if (fault := NodeFault.parse(share.get("node_fault")))}
    said = "; ".join(f"{hosts[rank] if rank < len(hosts) else f'node-{rank}'} (node-{rank}): {why_faulty(fault)}"
                     for rank, fault in sorted((lost or {}).items()))
    requeue = warned and requeued < requeues
    host = hosts[node] if node is not None and node < len(hosts) else None
    end = AttemptEnd(code, attempt, first, node, host, signs, {**silenced(shares), **(lost or {})}, final=warned)
    return ScriptEnd(end, RunState.REQUEUED if requeue else attempt_end(shares, code, bool(lost)), said, requeue)


def silenced(shares: Sequence[Mapping[str, object]]) -> dict[int, NodeFault]:
    """The nodes another node of the attempt lost to silence (frozen, cut off: ``lost_nodes`` of ``shares``, their
    state.json in node order), each with its ``unreachable`` sign; a closed connection is a supervisor's end, which
    its own record says more of."""
    return {node: fault for share in shares for node, fault in parse_faults(share.get("lost_nodes")).items()
            if not fault.closed}


def attempt_end(shares: Sequence[Mapping[str, object]], code: int, lost: bool) -> RunState:
    """How an attempt ended: ``node-failure`` where the scheduler ``lost`` a node of it; ``failed`` where a node lost
    another to silence (:func:`silenced`: the frozen node, thawed by the step's stop, and the node that stopped for
    it may both record ``stopped``); else as its nodes' supervisors recorded it where each recorded its share's end
    (``shares``: their state.json, in node order); else as its exit ``code`` alone says (states.py's
    :func:`exit_state`)."""
    if lost:
        return exit_state(code, Ending.LOST)
    if silenced(shares):
        return RunState.FAILED
    ends = [RunState.parse(share.get("state")) for share in shares]
    recorded = run_state(ends) if ends and all(end in ENDED for end in ends) else None
    return recorded if recorded is not None else exit_state(code, Ending.CODE_ONLY)


def standby_for(node: int, spares: Sequence[str], used: int) -> tuple[int | None, str]:
    """The standby slot that takes node ``node``'s place in a detached run with standbys on ``spares`` (in slot
    order), ``used`` of them taken so far, else None and why none can."""
    if node != 0 and used < len(spares):
        return used, ""
    return None, (RENDEZVOUS_LOST if node == 0
                  else "no standby host is left" if spares
                  else "the nodes of a detached run restart it where it ran; ssh.spares, or a launch attached, "
                       "leave the node out")


RENDEZVOUS_LOST = "node 0 holds the rendezvous, which a standby cannot take over: no rendezvous host is left"
"""Why a detached run that must leave node 0 out (lost: frozen, cut off) is not restarted."""


def without_rendezvous(lost: Mapping[int, NodeFault]) -> str | None:
    """Why a detached run is not restarted by a node that lost node 0 (``lost``: the nodes it lost, each with its
    sign): node 0, frozen or cut off, neither hands its place over nor moves the pods, and the next attempt has no
    rendezvous host; None where node 0 is not among them."""
    if 0 not in lost:
        return None
    return f"node-0 must be left out of the run ({why_faulty(lost[0])}): not restarting it ({RENDEZVOUS_LOST})"
