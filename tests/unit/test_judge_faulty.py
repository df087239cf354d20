"""``attempt_facts``, judged: the restart policy's verdict on an attached attempt, from the
records the nodes' supervisors kept: a node-fault sign excludes its node at once, recorded for later runs (the first
failure's NCCL network error, Xid or ECC event; a node's own in-node check or lost supervisor; ssh's 255 where the
node has no record of the run); else the node that failed first in two attempts, for the rest of the run only; the
same error in two attempts stops the restarts and excludes nothing."""

from __future__ import annotations

from typing import Any

from mlenv.core.capabilities import LaunchOutcome
from mlenv.ops.launch import attempt_facts
from mlenv.runtime.records.restartpolicy import History
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.supervise.control import CLOSED

FAILED_1, FAILED_3, FAILED_255 = ({"state": "failed", "exit_code": code} for code in (1, 3, 255))

HOSTS = {0: "gpu-a", 1: "gpu-b"}
LINE = "n1:88:102 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<4242> with error 12, opcode 0, len 0"


def outcome(codes: dict[int, int], failed: int | None = 1) -> LaunchOutcome:
    return LaunchOutcome(max(codes.values()), codes, {}, failed, hosts=HOSTS)


def run(first_node: int | None = 1, node_fault: dict[str, str] | None = None, tail: str = "step 1",
        **extra: Any) -> RunRecord:
    first = None if first_node is None else {"rank": 2, "node": first_node, "exit_code": 3, "signal": None,
                                             "reason": "exited with 3", "log_tail": [tail], "node_fault": node_fault}
    return RunRecord.from_dict({"id": "r", "state": "failed", "first_failure": first,
                                "nodes": {0: FAILED_3, 1: FAILED_3}, "node_faults": {}, **extra})


def judged(outcome: LaunchOutcome, run: RunRecord | None, history: History | None = None,
           attempt: int = 0) -> tuple[dict[int, tuple[str, bool]], History]:
    """Node -> (why it is left out, whether that is recorded for later runs), and the history after the attempt."""
    verdict = attempt_facts(outcome, run, attempt).judged(history or History())
    assert verdict.stop is None, verdict
    return {out.node: (out.reason, out.saved) for out in verdict.left_out}, verdict.history


def test_an_nccl_network_error_excludes_the_node_at_once_for_good() -> None:
    found, history = judged(outcome({0: 3, 1: 3}, failed=0), run(1, {"sign": "nccl-net", "evidence": LINE}))
    assert found == {1: (f"NCCL network error: {LINE}", True)} and history.failed_first == ("gpu-b",)


def test_xid_and_ecc_are_named_so() -> None:
    xid, _ = judged(outcome({0: 3, 1: 3}), run(0, {"sign": "xid", "evidence": "Xid 79 on GPU 3"}))
    ecc, _ = judged(outcome({0: 3, 1: 3}), run(1, {"sign": "ecc", "evidence": "GPU 1: retired pages 0 -> 1"}))
    assert (xid, ecc) == ({0: ("GPU Xid event: Xid 79 on GPU 3", True)},
                          {1: ("GPU ECC errors: GPU 1: retired pages 0 -> 1", True)})


def test_without_a_sign_the_node_failing_first_twice_is_left_out_of_this_run_only() -> None:
    found, history = judged(outcome({0: 3, 1: 3}), run(1, tail="step 1"))
    assert found == {}
    found, history = judged(outcome({0: 3, 1: 3}), run(0, tail="step 2"), history, 1)
    assert found == {}
    found, _ = judged(outcome({0: 3, 1: 3}), run(1, tail="step 3"), history, 2)
    assert found == {1: ("it failed first in 2 attempts of the run", False)}


def test_the_same_error_in_two_attempts_stops_the_restarts_and_excludes_nothing() -> None:
    _, history = judged(outcome({0: 3, 1: 3}), run(1, tail="FileNotFoundError: data.bin"))
    verdict = attempt_facts(outcome({0: 3, 1: 3}), run(1, tail="FileNotFoundError: data.bin"), 1).judged(history)
    assert verdict.left_out == () and verdict.stop == (
        "rank 2 (node-1) exited with 3: the same error in attempts 1 and 2: not restarting (a bug in the script is "
        "not a node fault: no node is left out)")
    elsewhere = attempt_facts(outcome({0: 3, 1: 3}), run(0, tail="FileNotFoundError: data.bin"), 1).judged(history)
    assert elsewhere.stop is not None  # the same rank's bug, wherever the rank ran
    signed = attempt_facts(outcome({0: 3, 1: 3}), run(1, {"sign": "nccl-net", "evidence": LINE},
                                                      tail="FileNotFoundError: data.bin"), 1).judged(history)
    assert signed.stop is None and [out.node for out in signed.left_out] == [1]  # a sign is a node fault


def test_without_the_supervisors_record_the_first_node_to_end_failed_counts() -> None:
    found, _ = judged(outcome({0: 3, 1: 143}, failed=0), None, History(("gpu-a",)), 1)
    assert found == {0: ("it failed first in 2 attempts of the run", False)}


def test_a_run_stopped_without_a_rank_s_failure_has_no_node_that_failed_first() -> None:
    found, _ = judged(outcome({0: 124, 1: 124}, failed=0), run(None), History(("gpu-a", "gpu-b")), 2)
    assert found == {}  # a transport contradiction, a hang stopped


def test_a_node_s_own_sign_excludes_it_whoever_failed_first() -> None:
    lost = {"sign": "unreachable", "evidence": "the node's supervisor (pid 42) is gone without an exit status"}
    found, _ = judged(outcome({0: 1, 1: 137}), run(None, node_faults={1: lost}))
    assert found == {1: ("unreachable: the node's supervisor (pid 42) is gone without an exit status", True)}
    refused = {"sign": "node-check", "evidence": "no ACTIVE port on mlx5_0"}
    found, _ = judged(outcome({0: 143, 1: 1}), run(None, node_faults={"1": refused}))
    assert found == {1: ("in-node check failed: no ACTIVE port on mlx5_0", True)}


def test_ssh_s_255_is_unreachable_only_where_the_node_has_no_record_of_the_run() -> None:
    nowhere = run(None, nodes={0: FAILED_1, 1: None})
    assert judged(outcome({0: 1, 1: 255}), nowhere)[0] == {
        1: ("unreachable: exit 255 and no record of the run there", True)}
    closed = run(None, nodes={0: FAILED_1, 1: None},
                 node_faults={"1": {"sign": "unreachable", "evidence": CLOSED, "closed": True}})
    assert judged(outcome({0: 1, 1: 255}), closed)[0] == {  # says more than node 0's closed channel
        1: ("unreachable: exit 255 and no record of the run there", True)}
    its_own = run(1, nodes={0: FAILED_255, 1: FAILED_255})  # the script's own exit(-1)
    assert judged(outcome({0: 255, 1: 255}), its_own)[0] == {}
