"""The goodput of a run (runtime/records/goodput.py) from hand-made records of its attempts: the phases, how they sum
to the wall time, and what a torn or missing record gives (null or partial, never a traceback)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mlenv.core.runrecords import latest_run
from mlenv.runtime.forensics.collectives import first_entered
from mlenv.runtime.records.goodput import describe, goodput
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.timeline import NodeAttempt, node_attempts
from mlenv.runtime.watch.progress import newest_mtime

T = 1_800_000_000.0  # the launch, in epoch seconds


def share(attempt: int, node: int, start: float, end: float | None, *, state: str = "succeeded",
          failed: float | None = None, collective: float | None = None, output: float | None = None,
          checkpoint: float | None = None) -> NodeAttempt:
    return NodeAttempt(attempt, node, T + start, None if end is None else T + end,
                       None if failed is None else T + failed, state,
                       None if collective is None else T + collective, None if output is None else T + output,
                       None if checkpoint is None else T + checkpoint)


def restarted(checkpoint: float | None) -> list[NodeAttempt]:
    """Two nodes; attempt 0 fails at 25 s (rank on node 1), attempt 1 succeeds at 50 s."""
    return [share(0, 0, 2.0, 27.0, state="failed", collective=5.5, output=4.0, checkpoint=checkpoint),
            share(0, 1, 2.5, 26.0, state="failed", failed=25.0, collective=5.0, checkpoint=checkpoint),
            share(1, 0, 29.0, 50.0, collective=31.0), share(1, 1, 29.5, 49.5, collective=31.2)]


def test_a_restarted_run_with_a_checkpoint_loses_only_the_work_since_it() -> None:
    found = goodput(restarted(checkpoint=20.0), T, now=T + 1000)
    assert found is not None and found.to_json() == {"wall": 50.0, "attempts": 2, "productive_share": 0.68, "phases": {
        "queued": 2.0, "starting": 3.0, "lost": 5.0, "restarting": 6.0, "productive": 34.0}}
    assert sum(found.phases.values()) == pytest.approx(found.wall)
    assert describe(found) == ("goodput: 68% productive (34.0 s of 50.0 s; queued 2.0 s, starting 3.0 s, "
                               "restarting 6.0 s, lost 5.0 s)")


def test_without_a_checkpoint_the_failed_attempt_s_whole_productive_time_is_lost() -> None:
    found = goodput(restarted(checkpoint=None), T, now=T + 1000)
    assert found is not None and found.phases["lost"] == 20.0 and found.phases["productive"] == 19.0


def test_a_checkpoint_from_before_the_attempt_counts_from_its_productive_start() -> None:
    found = goodput(restarted(checkpoint=-100.0), None, now=T + 1000)  # a previous run's file; launch unknown
    assert found is not None and found.phases["lost"] == 20.0 and found.phases["queued"] == 0.0
    assert found.wall == 48.0


def test_a_running_run_counts_to_now_and_a_job_without_collectives_starts_at_its_first_line() -> None:
    found = goodput([share(0, 0, 1.0, None, state="running", output=3.0)], T, now=T + 10)
    assert found is not None and found.to_json() == {"wall": 10.0, "attempts": 1, "productive_share": 0.7, "phases": {
        "queued": 1.0, "starting": 2.0, "lost": 0.0, "restarting": 0.0, "productive": 7.0}}
    assert describe(found) == "goodput: 70% productive (7.0 s of 10.0 s; queued 1.0 s, starting 2.0 s)"


def test_an_attempt_that_never_became_productive_is_all_starting() -> None:
    found = goodput([share(0, 0, 0.0, 8.0, state="failed", failed=8.0)], T, now=T + 100)
    assert found is not None and found.phases["starting"] == 8.0 and found.phases["productive"] == 0.0


def test_a_failed_last_attempt_loses_its_work_to_its_end() -> None:
    found = goodput([share(0, 0, 0.0, 12.0, state="failed", failed=10.0, collective=2.0, checkpoint=6.0)], T,
                    now=T + 100)
    assert found is not None and found.phases["lost"] == 6.0 and found.phases["productive"] == 4.0


def test_nothing_known_is_null_and_a_share_without_a_start_is_left_out() -> None:
    assert goodput([], T, now=T) is None
    assert goodput([NodeAttempt(0, 0, None, None, None, None)], T, now=T) is None
    found = goodput([NodeAttempt(0, 0, None, None, None, None), share(1, 0, 5.0, 9.0, collective=6.0)], T, now=T)
    assert found is not None and found.attempts == 1 and found.wall == 9.0
    assert NodeAttempt.parse({"attempt": "x"}) is None and NodeAttempt.parse([1]) is None


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def test_the_node_s_shares_are_read_from_its_attempt_directories_torn_ones_partly(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    _write(run / "attempt-0/node1/record.json", {"started_at": "2027-01-15T08:00:02.500+00:00"})
    _write(run / "attempt-0/node1/state.json", {"state": "failed", "progress": {
        "first_collective_at": T + 5, "first_output_at": None, "checkpoint_at": T + 20, "ended_at": T + 26}})
    _write(run / "attempt-0/node1/ranks.json", [{
        "rank": 3, "local_rank": 1, "node": 1, "host": "h1", "pid": 7, "state": "failed", "exit_code": 7,
        "signal": None, "started_at": "2027-01-15T08:00:03+00:00", "ended_at": "2027-01-15T08:00:25+00:00",
        "last_output_at": None}])
    _write(run / "attempt-1/node1/record.json", {"started_at": "2027-01-15T08:00:29+00:00"})
    _write(run / "attempt-1/node1/state.json", "{torn")
    _write(run / "attempt-1/node1/ranks.json", "[{")
    _write(run / "attempt-2/node1/record.json", "not json")
    first, second = node_attempts(run, 1)
    assert (first.attempt, first.state, first.failed_at, first.checkpoint_at) == (0, "failed", 1800000025.0, T + 20)
    assert first.started_at == 1800000002.5 and first.ended_at == T + 26
    assert second == NodeAttempt(1, 1, 1800000029.0, None, None, None)
    assert NodeAttempt.parse(first.to_dict()) == first
    assert node_attempts(tmp_path / "missing", 0) == []


def test_status_s_latest_run_carries_the_goodput_of_every_node_s_attempts() -> None:
    shares = restarted(checkpoint=20.0)
    jobs = {node: {"state": "succeeded", "exit_code": 0, "attempt": 1, "ranks": [],
                   "attempts": [s.to_dict() for s in shares if s.node == node] + ["torn"]} for node in (0, 1)}
    run = latest_run("r1", jobs)
    assert run.goodput is not None and run.goodput.attempts == 2 and run.goodput.phases["queued"] == 0.0
    shown = run.launched(T, T + 1000).to_dict()
    assert shown["goodput"]["phases"]["queued"] == 2.0 and shown["goodput"]["wall"] == 50.0
    assert RunRecord.from_dict(shown).goodput == run.launched(T, T + 1000).goodput
    assert latest_run("r2", {0: None}).to_dict()["goodput"] is None


def test_the_newest_checkpoint_is_the_newest_file_under_the_directory(tmp_path: Path) -> None:
    assert newest_mtime(tmp_path / "none") is None
    for name, mtime in (("a/step-1.pt", T + 1), ("a/b/step-2.pt", T + 2), ("step-0.pt", T)):
        _write(tmp_path / name, "x")
        os.utime(tmp_path / name, (mtime, mtime))
    assert newest_mtime(tmp_path) == T + 2
    assert newest_mtime(tmp_path, limit=1) in (T, T + 1, T + 2)


def test_the_first_collective_is_the_earliest_entry_of_the_flight_recorder_but_point_to_point() -> None:
    trace = {"entries": [{"time_created_ns": 30, "collective_seq_id": 2}, {"time_created_ns": 10, "is_p2p": True},
                         {"time_created_ns": 20, "collective_seq_id": 1}, {"time_created_ns": 0}]}
    assert first_entered(trace) == 20
    assert first_entered({"entries": [{"time_created_ns": 5, "is_p2p": True}]}) is None
    assert first_entered({}) is None
