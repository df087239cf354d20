"""The typed records of .mlenv/state.json (core/recorded.py): a file as this and earlier versions of mlenv wrote it
reads into them and is written back with the same keys; a record of another shape is the state file's one error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlenv import state
from mlenv.core.recorded import DeployOutcome, ExcludedNode, RecordedRun, SpareUse, SubmittedJob
from mlenv.errors import UsageError

HANDLE = {"backend": "ssh", "name": "lab", "nodes": 2, "mode": "tcp", "shared_workspace": False, "env": {},
          "data": {"hosts": ["a", "b"]}}
RUN = {"id": "r1", "script": "train.py", "launcher": "torchrun", "detached": True,
       "started": "2026-11-27T20:00:00+00:00", "preemptions": 1,
       "spares": [{"node": 0, "host": "gpu-0", "spare": "gpu-9"}]}
EXCLUDED = {"node": 1, "host": "gpu-7", "reason": "a node fault", "since": "2026-11-27T20:01:00+00:00"}
JOB = {"id": "4242", "run": "r2", "script": "train.py", "detached": True, "submitted": "2026-11-27T20:02:00+00:00",
       "restarts": 2, "followed": "2026-11-27T20:09:00+00:00", "next": "4243"}
UNFOLLOWED = {"id": "4243", "run": "r2", "script": "train.py", "detached": True,
              "submitted": "2026-11-27T20:02:00+00:00"}
"""A job as mlenv writes one submitted without --max-restarts: no ``restarts``, ``followed`` or ``next``."""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    return tmp_path


def _deployment(**fields: object) -> dict[str, object]:
    return {"name": "lab", "backend": "ssh", "cluster_file": "/clusters/lab.yaml", "mode": "tcp", "nodes": 2,
            "image": None, "handle": HANDLE, "runs": [], **fields}


def _file(**fields: object) -> dict[str, object]:
    return {"version": 2, "current": "lab", "deployments": {"lab": _deployment()}, "jobs": {}, **fields}


def _write(data: dict[str, object]) -> str:
    text = json.dumps(data, indent=2) + "\n"
    state.state_file().parent.mkdir(parents=True, exist_ok=True)
    state.state_file().write_text(text, encoding="utf-8")
    return text


def test_every_record_reads_typed_and_is_written_back_byte_for_byte() -> None:
    attempt = _deployment(handle={**HANDLE, "env": {"MASTER_ADDR": "b"}}, runs=[])
    text = _write(_file(deployments={"lab": _deployment(
        runs=[RUN, {"id": "r3", "script": "eval.py", "launcher": "python", "detached": False,
                    "started": "2026-11-27T21:00:00+00:00"}],
        excluded=[EXCLUDED], deploy={"state": "partial", "error": "host b: connection refused"},
        attempt=attempt, leftovers=[HANDLE])},
        jobs={"olivia": [JOB, UNFOLLOWED]}, excluded={"olivia": [EXCLUDED]}))
    loaded = state.load()
    lab = loaded.deployments["lab"]
    assert lab.runs[0] == RecordedRun("r1", "train.py", "torchrun", True, "2026-11-27T20:00:00+00:00", 1,
                                      (SpareUse(0, "gpu-0", "gpu-9"),))
    assert lab.runs[1].preemptions is None and lab.runs[1].spares is None and not lab.runs[1].detached
    assert lab.excluded == (ExcludedNode(1, "gpu-7", "a node fault", "2026-11-27T20:01:00+00:00"),)
    assert lab.deploy == DeployOutcome("partial", "host b: connection refused") and not lab.unfinished
    assert loaded.jobs["olivia"] == (SubmittedJob("4242", "r2", "train.py", True, "2026-11-27T20:02:00+00:00", 2,
                                                  "2026-11-27T20:09:00+00:00", "4243"),
                                     SubmittedJob("4243", "r2", "train.py", True, "2026-11-27T20:02:00+00:00"))
    assert loaded.excluded_of("olivia") == lab.excluded
    state.save(loaded)
    assert state.state_file().read_text(encoding="utf-8") == text


def test_a_file_of_an_earlier_version_reads_with_the_defaults_of_what_it_lacked() -> None:
    _write(_file(deployments={"lab": _deployment(runs=[{"id": "r1", "script": "train.py", "launcher": "torchrun",
                                                         "detached": True, "started": "2026-11-27T20:00:00+00:00"}])},
                 jobs={"olivia": [{"id": "4242", "run": "r2", "script": "train.py",
                                   "submitted": "2026-11-27T20:02:00+00:00"}]}))
    loaded = state.load()
    lab = loaded.deployments["lab"]
    assert lab.deploy == DeployOutcome() and lab.excluded == () and lab.attempt is None
    assert lab.runs == (RecordedRun("r1", "train.py", "torchrun", True, "2026-11-27T20:00:00+00:00"),)
    assert loaded.jobs["olivia"] == (SubmittedJob("4242", "r2", "train.py", True, "2026-11-27T20:02:00+00:00"),)
    assert "excluded" not in json.loads(json.dumps(lab.to_json()))  # a ready deployment reads as before


@pytest.mark.parametrize("bad", [
    {"deployments": {"lab": _deployment(runs=[{"script": "train.py"}])}},  # a run without its id
    {"deployments": {"lab": _deployment(runs=[{"id": 7}])}},
    {"deployments": {"lab": _deployment(excluded=[{"node": "one", "host": "gpu-7"}])}},
    {"deployments": {"lab": _deployment(deploy={"state": "done", "error": None})}},
    {"jobs": {"olivia": ["4242"]}},
    {"jobs": {"olivia": [{**JOB, "restarts": True}]}},
])
def test_a_record_of_another_shape_is_the_state_files_error(bad: dict[str, object]) -> None:
    text = _write(_file(**bad))
    with pytest.raises(UsageError, match="is not a state file mlenv can read"):
        state.load()
    assert state.state_file().read_text(encoding="utf-8") == text


def test_a_followed_job_keeps_the_next_job_it_knew() -> None:
    job = SubmittedJob.from_json(JOB)
    assert job.followed_at("later", None).next == "4243"
    assert job.followed_at("later", "4250") == SubmittedJob.from_json({**JOB, "followed": "later", "next": "4250"})
