"""The Slurm backend's reader of the nodes' records (one sh command on the login host, here on a real directory tree
through ``Login(None)``): the newest attempt of a run, each node's share as ``jobs --json`` gives it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.noderecords import node_job, read
from mlenv.runtime.records.states import NodeFault, RunState

FAILURE = {"rank": 3, "node": 1, "exit_code": 3, "signal": None, "reason": "exited with 3",
           "log_tail": ["a line with \x1e, \"quotes\"", "[node-1 r3] failing"]}


def rank(number: int, node: int, state: str, exit_code: int | None) -> dict[str, Any]:
    return {"rank": number, "local_rank": number % 2, "node": node, "host": f"n{node + 1}", "pid": 4200 + number,
            "state": state, "exit_code": exit_code, "signal": None, "started_at": "2026-11-25T20:00:00+00:00",
            "ended_at": None, "last_output_at": None}


def write(runs: Path, run: str, attempt: int, node: int, **files: object) -> None:
    directory = runs / run / f"attempt-{attempt}" / f"node{node}"
    directory.mkdir(parents=True)
    for name, content in files.items():
        (directory / name.replace("_", ".")).write_text(content if isinstance(content, str)
                                                        else json.dumps(content, indent=2) + "\n")


def test_the_newest_attempt_of_the_run_node_by_node(tmp_path: Path) -> None:
    write(tmp_path, "r1", 9, 0, exit="0\n")
    write(tmp_path, "r1", 10, 1, exit="3\n", record_json={"pid": 1}, state_json={"state": "failed",
                                                                                 "first_failure": FAILURE},
          ranks_json=[rank(2, 1, "stopped", 143), rank(3, 1, "failed", 3)])
    write(tmp_path, "r1", 10, 0, record_json={"pid": 2}, state_json={"state": "running"},
          ranks_json=[rank(0, 0, "running", None)])
    (tmp_path / "r1" / "attempt-x").mkdir()
    (tmp_path / "allocation-7.log").write_text("not a run\n")
    attempt, files, stopped, *_ = read(Login(None), str(tmp_path), "r1")
    assert (attempt, sorted(files), sorted(files[1])) == (10, [0, 1], ["exit", "ranks.json", "record.json",
                                                                        "state.json"])
    failed = node_job(files[1], attempt, live=False)
    assert failed is not None
    assert (failed["state"], failed["exit_code"], failed["attempt"], failed["first_failure"]) == (
        "failed", 3, 10, FAILURE)
    assert [(r["rank"], r["pid"], r["state"]) for r in failed["ranks"]] == [(2, 4202, "stopped"), (3, 4203, "failed")]
    running = node_job(files[0], attempt, live=True)
    assert running is not None and (running["state"], running["exit_code"]) == ("running", None)
    lost = node_job(files[0], attempt, live=False)  # its supervisor started, the job is gone, no exit status
    assert lost is not None and (lost["state"], lost["reason"]) == ("failed", "gone without an exit status")
    assert not stopped
    (tmp_path / "r1" / "stop").write_text("2026-11-25T20:01:00Z\n")  # mlenv stop's, before it cancelled the step
    attempt, files, stopped, *_ = read(Login(None), str(tmp_path), "r1")
    by_user = [node_job(files[node], attempt, live=False, stopped=stopped) for node in (0, 1)]
    assert [(job or {}).get("state") for job in by_user] == ["stopped", "stopped"], by_user
    assert [(job or {}).get("first_failure") for job in by_user] == [None, None]  # no rank failed of its own


def test_a_node_slurm_lost_failed_with_its_sign_never_stopped(tmp_path: Path) -> None:
    """The run's script wrote the attempt's lost.json (Slurm took node 1 out of the job): node 1 failed with the
    node-failure sign, whether its supervisor recorded anything (it was killed) or not, stop file or not."""
    write(tmp_path, "r1", 0, 0, record_json={"pid": 1}, state_json={"state": "running"})
    sign = {"sign": "node-failure", "evidence": "Slurm took n2 out of the job"}
    (tmp_path / "r1" / "attempt-0" / "lost.json").write_text(json.dumps({"1": sign}))
    found = read(Login(None), str(tmp_path), "r1")
    assert found.lost == {1: NodeFault("node-failure", "Slurm took n2 out of the job")}
    lost = node_job(found.files.get(1, {}), found.attempt, live=False, stopped=True, lost=found.lost[1])
    assert lost is not None
    assert (lost["state"], lost["reason"], lost["node_fault"]) == (
        "failed", "node failure: Slurm took n2 out of the job", sign)
    assert (node_job(found.files[0], found.attempt, live=False) or {}).get("node_fault") is None
    assert found.ended is None
    (tmp_path / "r1" / "attempt-0" / "ended").write_text("node-failure\n")  # the script's record of the attempt
    assert read(Login(None), str(tmp_path), "r1").ended == "node-failure"


def test_nodes_that_have_not_written(tmp_path: Path) -> None:
    assert read(Login(None), str(tmp_path / "none"), "r1") == (0, {}, False, {}, None, {})
    (tmp_path / "r2" / "attempt-0").mkdir(parents=True)
    assert read(Login(None), str(tmp_path), "r2") == (0, {}, False, {}, None, {})
    assert node_job({}, 0, live=True) == {"attempt": 0, "state": "running", "exit_code": None, "reason": None,
                                          "first_failure": None, "transport": None, "stacks": None, "idle": None,
                                          "stragglers": None, "lost_nodes": None, "ranks": [], "node_fault": None,
                                          "attempts": []}
    assert node_job({}, 0, live=False) is None


def test_an_ended_node_without_a_state_of_its_own_and_a_hung_one() -> None:
    ended = [node_job({"exit": "143\n", "state.json": '{"state": "running"}'}, 0, live=False),
             node_job({"exit": "0\n", "state.json": "not JSON"}, 0, live=True)]
    assert [(job or {}).get("state") for job in ended] == ["stopped", "succeeded"]
    hung = node_job({"state.json": '{"state": "hung", "stacks": "/w/stacks/t"}'}, 0, live=True)
    assert hung is not None and (hung["state"], hung["stacks"]) == ("hung", "/w/stacks/t")


def test_without_a_run_id_the_newest_run(tmp_path: Path) -> None:
    write(tmp_path, "20261125-200000-a", 0, 0, ranks_json=[rank(0, 0, "succeeded", 0)])
    write(tmp_path, "20261125-200100-b", 0, 1, ranks_json=[rank(1, 1, "running", None)])
    attempt, files, *_ = read(Login(None), str(tmp_path), None)
    assert (attempt, list(files)) == (0, [1]) and '"rank": 1' in files[1]["ranks.json"]
    (tmp_path / "20261125-200000-a" / "deployment").write_text("a\n")
    (tmp_path / "20261125-200100-b" / "deployment").write_text("b\n")  # another cluster file's, sharing the workdir
    assert list(read(Login(None), str(tmp_path), None, "a").files) == [0]


def test_a_run_of_the_same_second_with_its_suffix_is_the_newer(tmp_path: Path) -> None:
    write(tmp_path, "20261125-200000-a", 0, 0, ranks_json=[rank(0, 0, "succeeded", 0)])
    write(tmp_path, "20261125-200000-a-2", 0, 1, ranks_json=[rank(1, 1, "running", None)])
    assert list(read(Login(None), str(tmp_path), None, "a").files) == [1]


def test_a_batch_run_s_state_follows_its_job() -> None:
    """The nodes' records end with each attempt; the job says whether the run goes on, and how it ended."""
    from mlenv.backends.slurm.jobs import JobInfo
    from mlenv.backends.slurm.runstate import reconcile

    assert reconcile("succeeded", JobInfo("7", "PENDING", "BeginTime")) == "requeued"  # after the warning
    assert reconcile("failed", JobInfo("7", "PREEMPTED")) == "preempted"
    assert reconcile(RunState.SUCCEEDED, JobInfo("7", "FAILED", exit_code=1)) == "failed"  # the requeue was refused
    assert reconcile(RunState.SUCCEEDED, JobInfo("7", "COMPLETED", exit_code=0)) == "succeeded"
    assert reconcile(RunState.SUCCEEDED, JobInfo("7", "CANCELLED", exit_code=143)) == "stopped"  # scancel: a stop
    assert reconcile("running", JobInfo("7", "RUNNING")) == "running"
    assert reconcile(None, JobInfo("7", "PENDING")) is None  # never started: nothing to say
    assert reconcile("succeeded", None) == "succeeded"  # a run inside the allocation
    assert reconcile("succeeded", JobInfo("7", "CANCELLED", exit_code=143), stopped=True) == "stopped"  # mlenv stop
    # once the step or job is gone, how the script recorded the attempt's end: a node lost is a failure, never a stop
    assert reconcile("running", None, ended="node-failure") == "failed"
    assert reconcile("failed", None, ended="stopped") == "stopped"
    assert reconcile("succeeded", JobInfo("7", "PENDING", "BeginTime"), ended="requeued") == "requeued"
    assert reconcile("succeeded", JobInfo("7", "FAILED", exit_code=1), ended="failed") == "failed"
    assert reconcile("running", None, ended="not a state") == "running"


def test_each_node_s_share_of_every_attempt_for_the_run_s_goodput(tmp_path: Path) -> None:
    progress = {"first_collective_at": 1800000005.0, "first_output_at": None, "checkpoint_at": 1800000020.0,
                "ended_at": 1800000026.0}
    write(tmp_path, "r1", 0, 1, exit="3\n", record_json={"node_rank": 1, "started_at": "2027-01-15T08:00:02+00:00"},
          state_json={"state": "failed", "progress": progress}, ranks_json=[rank(3, 1, "failed", 3)])
    write(tmp_path, "r1", 1, 1, record_json={"node_rank": 1, "started_at": "2027-01-15T08:00:29+00:00"},
          state_json={"state": "running"}, ranks_json="[{torn")
    write(tmp_path, "r1", 0, 0, state_json="{torn")  # no record.json: no share of attempt 0
    found = read(Login(None), str(tmp_path), "r1")
    assert (found.attempt, sorted(found.earlier), sorted(found.earlier[1][0])) == (
        1, [0, 1], ["ranks.json", "record.json", "state.json"])
    job = node_job(found.files[1], found.attempt, live=True, earlier=found.earlier.get(1)) or {}
    shares = job["attempts"]
    assert [(share["attempt"], share["node"], share["started_at"], share["state"]) for share in shares] == [
        (0, 1, 1800000002.0, "failed"), (1, 1, 1800000029.0, "running")]
    assert (shares[0]["checkpoint_at"], shares[0]["ended_at"]) == (1800000020.0, 1800000026.0)
    assert (node_job({}, 0, live=True, earlier=found.earlier.get(0)) or {})["attempts"] == []
