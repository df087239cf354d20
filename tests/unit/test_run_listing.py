"""``mlenv runs``' rows from what the deployment recorded of a run and what its nodes did (``ops.runs.entry``): the
attempts counted, the duration from its start to its last rank's end (or to now while it runs), the table's cells
with the first failure in one line."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from mlenv.core.recorded import RecordedRun, SpareUse
from mlenv.ops.runs import cells, distinct, duration, entry
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import NodeEnd, RunState

RECORDED = RecordedRun("20261127-200000-out", "train.py", detached=True, started="2026-11-27T20:00:00+00:00")
NOW = datetime(2026, 11, 27, 20, 10, tzinfo=timezone.utc)


def test_an_ended_run_lasts_until_its_last_rank_ended() -> None:
    failure = FirstFailure(3, 1, 3, None, "exited with 3", ["Traceback", "ValueError: bad batch", ""])
    record = RunRecord("20261127-200000-out", RunState.FAILED, 1, first_failure=failure,
                       nodes={0: NodeEnd(RunState.STOPPED, 143), 1: NodeEnd(RunState.FAILED, 3)}, exit_code=3,
                       ended_at="2026-11-27T20:01:05.500+00:00")
    row = entry("out", RECORDED, record, NOW)
    assert (row.state, row.exit_code, row.attempts, row.duration, row.nodes) == ("failed", 3, 2, 65.5, 2)
    shown = row.to_json()
    assert shown["node_states"] == {"0": "stopped (143)", "1": "failed (3)"} and shown["first_failure"] == {
        **failure.to_dict()} and shown["id"] == "20261127-200000-out" and shown["cluster"] == "out"
    assert cells(row) == ["20261127-200000-out", "failed", "3", "2", "1m05s", "11-27 20:00:00", "2", "train.py",
                          "rank 3 (node-1) exited with 3: ValueError: bad batch"]


def test_a_running_run_lasts_until_now_and_an_unknown_one_is_said_so() -> None:
    going = entry("out", RECORDED, RunRecord("20261127-200000-out", RunState.RUNNING, 0,
                                             nodes={0: NodeEnd(RunState.RUNNING), 1: None}), NOW)
    assert (going.state, going.exit_code, going.attempts, going.duration, going.nodes) == ("running", None, 1, 600.0, 1)
    unknown = entry("out", RECORDED, None, NOW)
    assert (unknown.state, unknown.attempts, unknown.duration, unknown.first_failure) == (None, None, None, None)
    assert cells(unknown)[1:4] == ["unknown", "-", "-"]


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (None, 4.2, 65, 3600 * 2 + 61)] == ["-", "4s", "1m05s", "2h01m"]


def test_a_run_restarted_attached_is_one_run_from_its_first_start() -> None:
    again = replace(RECORDED, started="2026-11-27T20:05:00+00:00", spares=(SpareUse(1, "gpu-1", "gpu-9"),))
    other = replace(RECORDED, id="20261127-200700-out", started="2026-11-27T20:07:00+00:00")
    assert distinct([RECORDED, again, other]) == [replace(again, started=RECORDED.started), other]
