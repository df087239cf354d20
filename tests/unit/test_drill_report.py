"""The drill's report from what it saw and the run's records (ops.drill.report): each phase in seconds from the
fault, from the supervisors' own times (a dead rank's end, the last stop, the next attempt's first start) and the
job's lines (the step it resumed at, the steps recomputed); a phase never seen has no time and FAILs."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from mlenv.core.capabilities import LaunchOutcome, LaunchSpec
from mlenv.ops.drill import Targets, Watch, report
from mlenv.ops.launch import LaunchResult
from mlenv.runtime.records.runlayout import FirstFailure, RankRecord
from mlenv.runtime.records.runrecord import RunRecord

T0 = 1_800_000_000.0
"""The fault, seconds since the epoch."""


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, timezone.utc).isoformat(timespec="milliseconds")


def _rank(rank: int, state: str, started: float, ended: float | None) -> RankRecord:
    return RankRecord(rank, rank % 2, rank // 2, "h", 100 + rank, state, 1 if state == "failed" else None, None,
                      _at(started), _at(ended) if ended is not None else None, None)


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    (tmp_path / "clusters").mkdir()
    directory = tmp_path / "runs" / "r1"
    (directory / "attempt-1").mkdir(parents=True)
    (directory / "node-0.log").write_text("".join(f"[node-0 r0] step {n}/60 t={T0 - 10 + n * 0.25:.3f}\n"
                                                  for n in range(1, 10)))
    (directory / "node-1.log").write_text(f"[node-1 r3] drill: rank 3 exits with 1 at step 10 t={T0:.3f}\n")
    (directory / "attempt-1" / "node-0.log").write_text(
        f"[node-0 r0] drill: attempt 1 resumed at step 9 t={T0 + 5:.3f}\n[node-0 r0] step 10/60 t={T0 + 6.5:.3f}\n")
    return directory


def _result(run_dir: Path, code: int = 0) -> LaunchResult:
    return LaunchResult(LaunchOutcome(code, {0: code, 1: code}, {}), "r1", run_dir / "attempt-1", 30.0, attempt=1)


def test_every_phase_from_the_records(run_dir: Path) -> None:
    first = RunRecord("r1", "failed", 0, (_rank(0, "stopped", -8, 1.0), _rank(1, "stopped", -8, 1.2),
                                          _rank(2, "stopped", -8, 0.9), _rank(3, "failed", -8, 0.4)),
                      first_failure=FirstFailure(3, 1, 1, None, "exited with 1", []))
    final = RunRecord("r1", "succeeded", 1, tuple(_rank(r, "succeeded", 3.5 + r / 10, 20) for r in range(4)))
    watch = Watch(None, LaunchSpec("torchrun", "job.py"), "rank-exit", 10, 1, first=first)  # type: ignore[arg-type]
    drill = report("rank-exit", 10, Targets(), watch, _result(run_dir), final).to_json()
    assert [(p["phase"], p["seconds"], p["verdict"]) for p in drill["phases"]] == [
        ("detected", 0.4, "PASS"), ("stopped", 1.2, "PASS"), ("started", 3.5, "PASS"), ("resumed", 6.5, "PASS")]
    assert drill["phases"][0]["evidence"] == "rank 3 (node-1) exited with 1"
    assert (drill["resumed_step"], drill["last_step"], drill["lost_steps"], drill["verdict"]) == (9, 9, 0, "PASS")
    assert drill["node"] is None and drill["run_dir"] == str(run_dir)
    assert drill["ranks"][3] == {"rank": 3, "attempts": [[-8.0, 0.4, 0], [3.8, 20.0, 1]]}


def test_a_phase_never_seen_fails(run_dir: Path) -> None:
    first = RunRecord("r1", "failed", 0, (_rank(3, "failed", -8, 7.0),),
                      first_failure=FirstFailure(3, 1, 1, None, "exited with 1", []))
    final = RunRecord("r1", "failed", 0, first.ranks)  # never restarted
    watch = Watch(None, LaunchSpec("torchrun", "job.py"), "rank-exit", 10, 1, first=first)  # type: ignore[arg-type]
    drill = report("rank-exit", 10, Targets(), watch, _result(run_dir, 1), final).to_json()
    verdicts = {p["phase"]: (p["seconds"], p["verdict"]) for p in drill["phases"]}
    assert verdicts["detected"] == (7.0, "FAIL")  # over the 5 s of a dead rank
    assert verdicts["started"] == (None, "FAIL") and drill["verdict"] == "FAIL" and drill["exit_code"] == 1
