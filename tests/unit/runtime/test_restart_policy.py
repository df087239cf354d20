"""The restart policy (runtime/records/restartpolicy.py), judged from the first failures that real supervisor runs
recorded: as the nodes of a detached run judge before they restart it, and as the runtime that runs a Slurm run's
attempts asks it (supervise/slurmsteps.py). The rule "failed first in N attempts" is written in the policy
alone."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mlenv.runtime.records.restartpolicy import (
    FAULTY_AFTER,
    History,
    decide,
    failed_first,
    judge,
    may_restart,
    standby_for,
    without_rendezvous,
)
from mlenv.runtime.records.runlayout import LOST_FILE, FirstFailure, NodeDir, read_state
from mlenv.runtime.records.states import Ending, FaultSign, NodeFault, exit_state
from mlenv.runtime.supervise.launcher import RUNTIME_PARENT, Job, run_job
from mlenv.runtime.supervise.slurmsteps import verdict_for
from mlenv.runtime.watch.faultsigns import NodeFaultWatch

ROOT = Path(__file__).resolve().parents[3]
NET_ERROR = ("node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer "
             "10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)")


def _record(run_dir: Path, attempt: int, code: str) -> FirstFailure:
    """Run ``code`` as rank 0 of node 0 in attempt ``attempt`` of a real supervisor run; its first failure."""
    script = run_dir.parent / "job.py"
    script.write_text(code)
    launcher = ("import os, subprocess, sys\n"
                "sys.exit(subprocess.call([sys.executable, '-m', 'mlenv.runtime.rank', sys.argv[1]],"
                " env={**os.environ, 'RANK': '0', 'LOCAL_RANK': '0'}))\n")
    job = Job([sys.executable, "-c", launcher, str(script)],
              {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": RUNTIME_PARENT}, {}, {})
    node_dir = NodeDir(run_dir, attempt, 0)
    run_job(job, node_dir=node_dir, observers=[NodeFaultWatch(nvidia_smi="no-such-nvidia-smi",
                                                               kmsg=run_dir.parent / "no-kmsg")])
    first = FirstFailure.parse(read_state(node_dir)["first_failure"])
    assert first is not None
    return first


def test_a_node_failing_first_twice_with_different_errors_is_left_out_of_this_run_only(tmp_path: Path) -> None:
    first = _record(tmp_path / "run", 0, "print('step 10'); raise SystemExit(3)")
    who = failed_first(first)
    assert who == first.host and who  # the rank's host
    once = judge(0, History(), first)
    assert once.left_out == () and once.stop is None and once.history.failed_first == (who,)  # not yet a fault
    second = _record(tmp_path / "run", 1, "print('step 20'); raise SystemExit(3)")
    twice = judge(1, once.history, second)
    assert [(out.node, out.reason, out.saved) for out in twice.left_out] == [
        (0, f"it failed first in {FAULTY_AFTER} attempts of the run", False)]
    assert judge(1, History(("another-host",), once.history.last_error), second).left_out == ()  # another host


def test_the_same_error_twice_is_a_bug_in_the_script(tmp_path: Path) -> None:
    bug = "open('missing.bin')"
    first, second = (_record(tmp_path / "run", attempt, bug) for attempt in (0, 1))
    verdict = judge(1, judge(0, History(), first).history, second)
    assert verdict.left_out == ()
    assert verdict.stop is not None and "the same error in attempts 1 and 2: not restarting" in verdict.stop
    assert "FileNotFoundError" in second.log_tail[-1]


def test_a_node_fault_sign_leaves_the_node_out_at_once_for_good(tmp_path: Path) -> None:
    netfail = _record(tmp_path / "net", 0, f"print({NET_ERROR!r}); raise SystemExit(3)")
    (out,) = judge(0, History(), netfail).left_out
    assert (out.node, out.reason, out.saved) == (0, f"NCCL network error: {NET_ERROR}", True)
    lost = judge(0, History(), None, signs={1: NodeFault("node-failure", "n2 went DOWN")}).left_out
    assert [(out.node, out.reason, out.saved) for out in lost] == [(1, "node failure: n2 went DOWN", True)]


def test_what_is_never_restarted() -> None:
    assert [may_restart(code, 0, 3) for code in (0, 125, 129, 130, 143, 1, 137)] == [False] * 5 + [True, True]
    assert not may_restart(1, 3, 3)
    lost = NodeFault("node-failure", "n2: NODE_FAIL")  # Slurm's SIGTERM of a lost node is no user's stop
    assert may_restart(143, 0, 3, [lost]) and not may_restart(143, 3, 3, [lost])
    assert not may_restart(143, 0, 3, [NodeFault("nccl-net", "...")]) and not may_restart(0, 0, 3, [lost])


def test_which_standby_takes_a_node_s_place() -> None:
    assert standby_for(1, ["10.0.0.9"], 0) == (0, "")
    assert standby_for(1, ["10.0.0.9"], 1) == (None, "no standby host is left")
    assert standby_for(0, ["10.0.0.9"], 0)[0] is None  # node 0 holds the rendezvous
    assert standby_for(1, [], 0)[0] is None


def test_a_run_whose_node_0_was_lost_is_not_restarted_without_a_rendezvous_host() -> None:
    """Node 1 heard nothing from node 0 (frozen): node 0 is left out, recorded, and no standby can take the
    rendezvous, so the run is not restarted, said in one line; a lost node 1 leaves node 0 to restart it."""
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 8 s")
    (out,) = judge(0, History(), None, signs={0: silent}).left_out
    assert (out.node, out.saved) == (0, True) and out.reason == "unreachable: node 1 heard nothing from it for 8 s"
    assert standby_for(0, ["10.0.0.9"], 0)[0] is None and standby_for(0, [], 0)[0] is None
    said = without_rendezvous({0: silent})
    assert said == ("node-0 must be left out of the run (unreachable: node 1 heard nothing from it for 8 s): not "
                    "restarting it (node 0 holds the rendezvous, which a standby cannot take over: no rendezvous "
                    "host is left)")
    assert without_rendezvous({1: silent}) is None and without_rendezvous({}) is None


def _ask(run_dir: Path, attempt: int, code: int, history: dict[str, str] | None = None, *,
         failed_file: Path | None = None, warned: bool = False, requeues: int = 0, requeued: int = 0,
         job_nodes: str = "", node_states: str = "") -> dict[str, str]:
    """The policy's verdict as the runtime that runs a Slurm run's attempts asks it (supervise/slurmsteps.py), on a
    run on n1 and n2 with 3 restarts; every field as text, empty where the verdict has none."""
    past = History(tuple(history["failed_first"].split(",")[:attempt]), history["last_error"]) if history else History()
    found = verdict_for(run_dir, attempt, code, ["n1", "n2"], failed_file, warned, job_nodes, node_states,
                        requeues, requeued)
    end, verdict = found.end, decide(found.end, 3, past)
    answer = {"node": "" if end.node is None else end.node, "code": end.exit_code, "lost": found.lost,
              "ended": found.ended.value, "verdict": "requeue" if found.requeue else "end"}
    if verdict is not None:
        answer.update(verdict="restart", failed_first=",".join(verdict.history.failed_first),
                      last_error=verdict.history.last_error)
    if verdict is not None and verdict.stop is not None:
        answer.update(verdict="stop", why=verdict.stop)
    elif verdict is not None and verdict.left_out:
        left = verdict.left_out[0]
        answer.update(verdict="leave-out", left_node=left.node, why=left.reason, saved=int(left.saved),
                      host=["n1", "n2"][left.node])
    return {name: str(answer.get(name, "")) for name in ("node", "code", "verdict", "left_node", "host", "why",
                                                         "saved", "failed_first", "last_error", "lost", "ended")}


def test_slurm_s_attempts_ask_the_policy(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for attempt in (0, 1):  # node 1 fails first in both attempts, with a different last line
        (run_dir / f"attempt-{attempt}").mkdir(parents=True)
        (run_dir / f"attempt-{attempt}" / "failed").write_text("1 5\n")
    first = _ask(run_dir, 0, 5, failed_file=run_dir / "attempt-0" / "failed")
    assert (first["node"], first["code"], first["verdict"], first["failed_first"]) == ("1", "5", "restart", "n2")
    second = _ask(run_dir, 1, 5, first, failed_file=run_dir / "attempt-1" / "failed")
    assert (second["verdict"], second["left_node"], second["host"], second["saved"]) == ("leave-out", "1", "n2", "0")
    assert second["why"] == "it failed first in 2 attempts of the run"
    assert _ask(run_dir, 1, 143, first)["verdict"] == "end"  # a user's stop
    assert _ask(run_dir, 0, 5, warned=True)["verdict"] == "end"
    requeued = _ask(run_dir, 0, 0, warned=True, requeues=1, requeued=0)  # the warning: requeued
    assert (requeued["verdict"], requeued["ended"]) == ("requeue", "requeued"), requeued
    capped = _ask(run_dir, 1, 0, warned=True, requeues=1, requeued=1)  # as often as it may be
    assert (capped["verdict"], capped["ended"]) == ("end", "succeeded"), capped
    assert _ask(run_dir, 0, 5, requeues=1)["verdict"] == "restart"  # no warning: no requeue

    bug = tmp_path / "bug"
    for attempt in (0, 1):  # node 0 records the same error twice
        _record(bug, attempt, "open('missing.bin')")
    once = _ask(bug, 0, 1)
    again = _ask(bug, 1, 1, once)
    assert again["verdict"] == "stop" and "the same error in attempts 1 and 2: not restarting" in again["why"]


def test_a_node_slurm_lost_is_a_node_fault_never_a_user_s_stop(tmp_path: Path) -> None:
    """Slurm took n2 out of the job (--no-kill: the job goes on with n1), or says it is down: the node-failure sign,
    in the attempt's lost.json; the run goes on without n2, also after a stop's exit code, and n2 is recorded for
    later runs. A job that kept its nodes, all up, was stopped by the user."""
    runs = [tmp_path / f"run{index}" for index in range(3)]
    for run_dir in runs:
        (run_dir / "attempt-0").mkdir(parents=True)
    taken = _ask(runs[0], 0, 143, job_nodes="n1", node_states="n1|mixed|none\nn2|idle|none")
    assert (taken["verdict"], taken["left_node"], taken["host"], taken["saved"]) == ("leave-out", "1", "n2", "1")
    assert taken["why"] == "node failure: Slurm took n2 out of the job"
    assert taken["lost"] == "n2 (node-1): node failure: Slurm took n2 out of the job"
    assert json.loads((runs[0] / "attempt-0" / LOST_FILE).read_text()) == {
        "1": {"sign": "node-failure", "evidence": "Slurm took n2 out of the job"}}
    down = _ask(runs[1], 0, 137, node_states="n1|allocated|none\nn2|down*|Not responding\nn2|down*|x")
    assert (down["verdict"], down["host"]) == ("leave-out", "n2")
    assert down["why"] == "node failure: Slurm says it is down* (Not responding)"
    kept = _ask(runs[2], 0, 143, job_nodes="n[1-2]", node_states="n1|mixed|none\nn2|mixed|none")
    assert (kept["verdict"], kept["lost"], kept["ended"]) == ("end", "", "stopped")
    unknown = _ask(runs[2], 0, 143, job_nodes="(null)", node_states="n1|idle|none\nn2|idle|none")
    assert (unknown["verdict"], unknown["lost"]) == ("end", "")  # a job no longer running: its nodes say nothing
    assert not (runs[2] / "attempt-0" / LOST_FILE).exists()
    assert (taken["ended"], down["ended"]) == ("node-failure", "node-failure")  # how each attempt ended


def test_a_node_0_another_node_lost_to_silence_is_left_out_and_the_attempt_failed(tmp_path: Path) -> None:
    """Inside an allocation node 1 heard nothing from node 0 (frozen) and stopped; srun's stop then thawed node 0,
    which stopped too and found node 1's connection closed: both shares record ``stopped``. The attempt failed (no
    user's stop), node 0 is left out for its ``unreachable`` sign (the script's head moves with the node list) and
    node 1's closed connection blames nobody; no lost.json (Slurm lost no node)."""
    run_dir = tmp_path / "run"
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 8 s")
    closed = NodeFault(FaultSign.UNREACHABLE, "its control channel to node 0 closed before its job ended", True)
    for node, state, lost in ((0, "stopped", {"1": closed.to_dict()}), (1, "stopped", {"0": silent.to_dict()})):
        NodeDir(run_dir, 0, node).path.mkdir(parents=True)
        NodeDir(run_dir, 0, node).state.write_text(json.dumps({"state": state, "lost_nodes": lost}))
    said = _ask(run_dir, 0, 1, job_nodes="n[1-2]", node_states="n1|mixed|none\nn2|mixed|none")
    assert (said["verdict"], said["left_node"], said["host"], said["saved"]) == ("leave-out", "0", "n1", "1"), said
    assert (said["why"], said["ended"], said["lost"]) == (f"unreachable: {silent.evidence}", "failed", "")
    assert not (run_dir / "attempt-0" / LOST_FILE).exists()


def test_how_an_attempt_ended() -> None:
    assert [exit_state(code) for code in (0, 1, 137, 143, 130)] == [
        "succeeded", "failed", "failed", "stopped", "stopped"]
    assert exit_state(143, Ending.LOST) == exit_state(0, Ending.LOST) == "node-failure"


def test_the_rule_is_written_in_the_policy_alone() -> None:
    """No template, nor any other module, restates "failed first in N attempts" (or its count)."""
    written = [path for path in [*ROOT.joinpath("tools").rglob("*.py"), *ROOT.joinpath("manifests").rglob("*.j2")]
               if "failed first in" in path.read_text() and path.name != "restartpolicy.py"]
    assert written == []
