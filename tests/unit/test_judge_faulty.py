"""``judge_faulty``, the one place a failed attempt's nodes are judged faulty: a node-fault sign excludes its node at
once (the first failure's NCCL network error, Xid or ECC event; a node's own in-node check or lost supervisor; ssh's
255 where the node has no record of the run), else the node that failed first in two attempts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from mlenv.core.capabilities import LaunchOutcome
from mlenv.ops.launch import judge_faulty

HOSTS = {0: "gpu-a", 1: "gpu-b"}
LINE = "n1:88:102 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<4242> with error 12, opcode 0, len 0"


def outcome(codes: dict[int, int], failed: int | None = 1) -> LaunchOutcome:
    return LaunchOutcome(max(codes.values()), codes, {}, failed, hosts=HOSTS)


def run(first_node: int | None = 1, node_fault: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    first = None if first_node is None else {"rank": 2, "node": first_node, "exit_code": 3, "signal": None,
                                             "reason": "exited with 3", "log_tail": [], "node_fault": node_fault}
    return {"id": "r", "state": "failed", "first_failure": first, "nodes": {0: "failed (3)", 1: "failed (3)"},
            "node_faults": {}, **extra}


def test_an_nccl_network_error_excludes_the_node_at_once() -> None:
    counted: Counter[str] = Counter()
    found = judge_faulty(outcome({0: 3, 1: 3}, failed=0), run(1, {"sign": "nccl-net", "evidence": LINE}), counted)
    assert found == {1: f"NCCL network error: {LINE}"} and counted == Counter({"gpu-b": 1})


def test_xid_and_ecc_are_named_so() -> None:
    xid = judge_faulty(outcome({0: 3, 1: 3}), run(0, {"sign": "xid", "evidence": "Xid 79 on GPU 3"}), Counter())
    ecc = judge_faulty(outcome({0: 3, 1: 3}), run(1, {"sign": "ecc", "evidence": "GPU 1: retired pages 0 -> 1"}),
                       Counter())
    assert (xid, ecc) == ({0: "GPU Xid event: Xid 79 on GPU 3"}, {1: "GPU ECC errors: GPU 1: retired pages 0 -> 1"})


def test_without_a_sign_the_node_failing_first_twice_is_judged() -> None:
    counted: Counter[str] = Counter()
    assert judge_faulty(outcome({0: 3, 1: 3}), run(1), counted) == {}
    assert judge_faulty(outcome({0: 3, 1: 3}), run(0), counted) == {}
    assert judge_faulty(outcome({0: 3, 1: 3}), run(1), counted) == {1: "it failed first in 2 attempts of the run"}


def test_without_the_supervisors_record_the_first_node_to_end_failed_counts() -> None:
    counted: Counter[str] = Counter({"gpu-a": 1})
    assert judge_faulty(outcome({0: 3, 1: 143}, failed=0), None, counted) == {
        0: "it failed first in 2 attempts of the run"}


def test_a_run_stopped_without_a_rank_s_failure_has_no_node_that_failed_first() -> None:
    counted: Counter[str] = Counter({"gpu-a": 1, "gpu-b": 1})  # a transport contradiction, a hang stopped
    assert judge_faulty(outcome({0: 124, 1: 124}, failed=0), run(None), counted) == {}


def test_a_node_s_own_sign_excludes_it_whoever_failed_first() -> None:
    lost = {"sign": "unreachable", "evidence": "the node's supervisor (pid 42) is gone without an exit status"}
    found = judge_faulty(outcome({0: 1, 1: 137}), run(None, node_faults={1: lost}), Counter())
    assert found == {1: "unreachable: the node's supervisor (pid 42) is gone without an exit status"}
    refused = {"sign": "node-check", "evidence": "no ACTIVE port on mlx5_0"}
    found = judge_faulty(outcome({0: 143, 1: 1}), run(None, node_faults={"1": refused}), Counter())
    assert found == {1: "in-node check failed: no ACTIVE port on mlx5_0"}


def test_ssh_s_255_is_unreachable_only_where_the_node_has_no_record_of_the_run() -> None:
    nowhere = run(None, nodes={0: "failed (1)", 1: "-"})
    assert judge_faulty(outcome({0: 1, 1: 255}), nowhere, Counter()) == {
        1: "unreachable: exit 255 and no record of the run there"}
    its_own = run(1, nodes={0: "failed (255)", 1: "failed (255)"})  # the script's own exit(-1)
    assert judge_faulty(outcome({0: 255, 1: 255}), its_own, Counter()) == {}
