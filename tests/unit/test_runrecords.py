"""``core.runrecords.latest_run``: status's ``latest_run`` from each node's share of a run, as every backend gives it
(the fan-out backends from the runtime's ``jobs --json``, Slurm from the shared run directory), read once into a
typed ``RunRecord`` whose JSON is what the nodes recorded."""

from __future__ import annotations

from typing import Any

from mlenv.core.runrecords import latest_run, node_state
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import FaultSign, NodeEnd, NodeFault, RunState, end_text
from mlenv.runtime.supervise.control import CLOSED


def rank(number: int, node: int, state: str, exit_code: int | None = None) -> dict[str, Any]:
    return {"rank": number, "local_rank": number % 2, "node": node, "host": f"h{node}", "pid": 100 + number,
            "state": state, "exit_code": exit_code, "signal": None, "started_at": "2026-11-25T20:00:00+00:00",
            "ended_at": None, "last_output_at": None}


FAILURE = {"rank": 3, "node": 1, "exit_code": 3, "signal": None, "reason": "exited with 3", "log_tail": ["boom"],
           "node_fault": None, "host": "h1"}


def test_a_failed_run_names_its_first_failure_and_every_rank_in_order() -> None:
    run = latest_run("r1", {
        0: {"state": "failed", "exit_code": 143, "attempt": 1, "first_failure": FAILURE,
            "ranks": [rank(1, 0, "stopped", 143), rank(0, 0, "stopped", 143)],
            "transport": {"verdict": "TCP", "plugin": None, "devices": [], "nccl_version": None}},
        1: {"state": "failed", "exit_code": 3, "attempt": 1, "first_failure": FAILURE,
            "ranks": [rank(3, 1, "failed", 3), rank(2, 1, "stopped", 143)], "transport": None, "stacks": None},
    })
    assert (run.id, run.state, run.attempt, run.first_failure) == ("r1", "failed", 1, FirstFailure.from_dict(FAILURE))
    assert [(r.rank, r.pid, r.state) for r in run.ranks] == [
        (0, 100, "stopped"), (1, 101, "stopped"), (2, 102, "stopped"), (3, 103, "failed")]
    assert run.transport == {"node-0": {"verdict": "TCP", "plugin": None, "devices": [], "nccl_version": None}}
    assert (run.stacks, run.idle) == (None, None)
    assert run.nodes == {0: NodeEnd(RunState.STOPPED, 143), 1: NodeEnd(RunState.FAILED, 3)}  # stopped for node 1's
    assert {node: end_text(end) for node, end in run.nodes.items()} == {0: "stopped (143)", 1: "failed (3)"}
    shown = run.to_dict()  # status --json's latest_run: what the nodes recorded, as they recorded it
    assert shown["first_failure"] == FAILURE and shown["ranks"][3] == rank(3, 1, "failed", 3) and "nodes" not in shown
    nodes = {node: end.to_dict() if end is not None else None for node, end in run.nodes.items()}
    assert RunRecord.from_dict({**shown, "nodes": nodes}) == run


def test_a_node_s_own_sign_is_typed() -> None:
    lost = {"sign": "unreachable", "evidence": "the node's supervisor (pid 7) is gone without an exit status"}
    run = latest_run("r4", {0: {"state": "failed", "exit_code": 1, "node_fault": None},
                            1: {"state": "failed", "exit_code": None, "node_fault": lost}})
    assert run.node_faults == {1: NodeFault(FaultSign.UNREACHABLE, lost["evidence"])}
    assert run.to_dict()["node_faults"] == {1: lost}


def test_a_node_node_0_lost_is_unreachable_in_the_words_that_say_more() -> None:
    """Node 0's sign names a node lost to silence or a closed connection; over the node's own ``unreachable`` only
    for a silence (its own says more of a supervisor that is gone)."""
    gone = {"sign": "unreachable", "evidence": "the node's supervisor (pid 7) is gone without an exit status"}
    silent = NodeFault(FaultSign.UNREACHABLE, "node 0 heard nothing from it for 8 s")
    closed = NodeFault(FaultSign.UNREACHABLE, CLOSED, closed=True)
    for lost, own, found in ((silent, None, silent), (silent, gone, silent), (closed, None, closed),
                             (closed, gone, NodeFault.parse(gone))):
        run = latest_run("r5", {0: {"state": "failed", "exit_code": 1, "lost_nodes": {"1": lost.to_dict()}},
                                1: {"state": "failed" if own else "running", "exit_code": None, "node_fault": own}})
        assert run.node_faults == {1: found}, (lost, own)


def test_a_node_lost_in_its_attempt_fails_the_run_and_the_node_that_lost_it_stopped_for_it() -> None:
    """A node another node lost in the same attempt reads failed although its own record runs (frozen: it records
    nothing), the run too, and the healthy node that stopped for the loss is no failure; a node lost in an earlier
    attempt that runs a later one runs."""
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 8 s").to_dict()
    run = latest_run("r7", {0: {"state": "running", "exit_code": None, "attempt": 0},
                            1: {"state": "failed", "exit_code": 1, "attempt": 0, "lost_nodes": {"0": silent}}})
    assert run.state is RunState.FAILED and run.exit_code is None
    assert run.nodes == {0: NodeEnd(RunState.FAILED), 1: NodeEnd(RunState.STOPPED, 1)}
    later = latest_run("r8", {0: {"state": "failed", "exit_code": 1, "attempt": 0, "lost_nodes": {"1": silent}},
                              1: {"state": "running", "exit_code": None, "attempt": 1}})
    assert later.nodes[1] == NodeEnd(RunState.RUNNING) and later.state is RunState.FAILED


def test_a_node_that_stopped_for_a_lost_node_0_whose_records_cannot_be_read_leaves_the_run_failed() -> None:
    """Node 1 records its own stop for the lost node 0 (``stopped``, as its supervisor writes it); node 0's records
    cannot be read (its machine gone): node 0 is unknown, the run failed, never ``stopped``."""
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 8 s")
    run = latest_run("r9", {0: None, 1: {"state": "stopped", "exit_code": 1, "lost_nodes": {"0": silent.to_dict()}}})
    assert (run.state, run.node_faults) == (RunState.FAILED, {0: silent})
    assert run.nodes == {0: None, 1: NodeEnd(RunState.STOPPED, 1)}


def test_a_frozen_node_0_thawed_by_the_stop_is_the_failure_and_the_node_it_lost_no_culprit() -> None:
    """Node 1 lost node 0 to silence and stopped; the stop that followed thawed node 0 (srun's SIGCONT and SIGTERM),
    which recorded ``stopped (143)`` and node 1's connection closed: node 0 failed and is the one named, node 1 (its
    closed connection the end of its stop for node 0) stopped, the run failed."""
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 8 s")
    closed = NodeFault(FaultSign.UNREACHABLE, CLOSED, closed=True)
    run = latest_run("r10", {0: {"state": "stopped", "exit_code": 143, "lost_nodes": {"1": closed.to_dict()}},
                             1: {"state": "stopped", "exit_code": 1, "lost_nodes": {"0": silent.to_dict()}}})
    assert (run.state, run.node_faults) == (RunState.FAILED, {0: silent})
    assert run.nodes == {0: NodeEnd(RunState.FAILED, 143), 1: NodeEnd(RunState.STOPPED, 1)}


def test_lost_nodes_an_earlier_version_recorded_in_words_read_as_a_silence() -> None:
    """Before the signs were typed node 0 recorded its words alone (``{"1": "..."}``): still read, as the
    ``unreachable`` sign of a silence (the words decide nothing)."""
    run = latest_run("r6", {0: {"state": "failed", "exit_code": 1,
                                "lost_nodes": {"1": "its control channel to node 0 closed before its job ended"}},
                            1: {"state": "running", "exit_code": None}})
    assert run.node_faults == {
        1: NodeFault(FaultSign.UNREACHABLE, "its control channel to node 0 closed before its job ended")}


def test_nodes_without_a_share_are_unknown_and_a_hung_node_makes_the_run_hung() -> None:
    run = latest_run("r2", {0: {"state": "hung", "exit_code": None, "stacks": "/runs/r2/stacks/t1",
                                "idle": {"node": 0}, "ranks": [rank(0, 0, "running")]},
                            1: {"state": "running", "exit_code": None, "ranks": []}, 2: None})
    assert (run.state, run.attempt, run.first_failure) == ("hung", 0, None)
    assert (run.stacks, run.idle) == ("/runs/r2/stacks/t1", {"node-0": {"node": 0}})
    assert run.nodes == {0: NodeEnd(RunState.HUNG), 1: NodeEnd(RunState.RUNNING), 2: None}
    assert [end_text(end) for end in run.nodes.values()] == ["hung", "running", "-"]


def test_no_share_anywhere_is_no_state() -> None:
    run = latest_run("r3", {0: None, 1: None})
    assert (run.state, run.ranks, run.transport, run.nodes) == (None, (), {}, {0: None, 1: None})
    assert node_state(None) is None and node_state({"state": "not a state"}) is None


def ended_rank(number: int, node: int, state: str, code: int, ended_at: str) -> dict[str, Any]:
    return {**rank(number, node, state, code), "ended_at": ended_at}


def test_an_ended_run_says_its_exit_code_and_when_its_last_rank_ended() -> None:
    failed = latest_run("r5", {
        0: {"state": "stopped", "exit_code": 143, "ranks": [ended_rank(0, 0, "stopped", 143, "2026-11-25T20:00:09")]},
        1: {"state": "failed", "exit_code": 3, "first_failure": FAILURE,
            "ranks": [ended_rank(3, 1, "failed", 3, "2026-11-25T20:00:08")]}})
    assert (failed.state, failed.exit_code, failed.ended_at) == ("failed", 3, "2026-11-25T20:00:09")
    assert failed.to_dict()["exit_code"] == 3 and RunRecord.from_dict(failed.to_dict()).exit_code == 3
    no_first = latest_run("r6", {0: {"state": "succeeded", "exit_code": 0}, 1: {"state": "failed", "exit_code": 7}})
    assert (no_first.exit_code, no_first.ended_at) == (7, None)  # the first code that is not 0; no rank known
    fine = latest_run("r7", {0: {"state": "succeeded", "exit_code": 0}, 1: {"state": "succeeded", "exit_code": 0}})
    assert fine.exit_code == 0


def test_a_run_with_a_node_still_running_has_not_ended() -> None:
    going = latest_run("r8", {0: {"state": "failed", "exit_code": 3, "first_failure": FAILURE},
                              1: {"state": "running", "exit_code": None}})
    assert (going.state, going.exit_code, going.ended_at) == ("failed", None, None)
