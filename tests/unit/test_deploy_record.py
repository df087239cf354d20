"""How .mlenv/state.json records deploys that fail: a first one is kept for clean but never made current; a
re-deploy keeps the deployment before it operated (its handle and runs) with the attempt beside it, which takes
over only when it succeeds; what a deploy in progress learns goes to the attempt."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from mlenv import state
from mlenv.core.capabilities import Handle
from mlenv.core.recorded import DeployOutcome, RecordedRun
from mlenv.ops.status import UNFINISHED, deploy_shown


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    return tmp_path


def _deployment(**data: object) -> state.Deployment:
    handle = Handle("ssh", "lab", 2, "tcp", False, {}, {"hosts": ["a", "b"], **data})
    return state.Deployment("lab", "ssh", "/clusters/lab.yaml", "tcp", 2, None, handle)


def test_a_failed_first_deploy_is_recorded_but_not_current() -> None:
    state.record(_deployment())
    state.failed("lab", "deploy failed on 1 of 2 hosts")
    recorded = state.load()
    assert recorded.current is None
    assert recorded.deployments["lab"].deploy == DeployOutcome("failed", "deploy failed on 1 of 2 hosts")
    assert recorded.deployments["lab"].handles == (_deployment().handle,)  # clean finds it


def test_a_failed_redeploy_keeps_the_deployment_before_it_and_the_attempt() -> None:
    before = _deployment(workspaces=["/w", "/w"])
    state.record(before)
    state.succeeded("lab")
    state.update("lab", runs=lambda runs: (*runs, RecordedRun("r1")))
    attempt = _deployment(workspaces=[])
    state.record(attempt)
    state.update("lab", handle=replace(attempt.handle, env={"MASTER_ADDR": "10.0.0.1"}))  # learned meanwhile
    state.failed("lab", "host b: connection refused")
    kept = state.load().deployments["lab"]
    assert state.load().current == "lab"
    assert kept.handle == before.handle and kept.runs == (RecordedRun("r1"),)
    assert kept.deploy == DeployOutcome("partial", "host b: connection refused")
    assert kept.attempt is not None and kept.attempt.handle.env == {"MASTER_ADDR": "10.0.0.1"}
    assert kept.handles == (before.handle, kept.attempt.handle)
    state.update("lab", handle=replace(before.handle, env={"MASTER_PORT": "1"}))  # a later launch: the operated one
    assert state.load().deployments["lab"].handle.env == {"MASTER_PORT": "1"}
    state.record(attempt)  # deployed again, and this time it works
    state.update("lab", handle=replace(attempt.handle, env={"MASTER_ADDR": "10.0.0.2"}))
    state.succeeded("lab")
    done = state.load().deployments["lab"]
    assert done.handle.env == {"MASTER_ADDR": "10.0.0.2"} and done.runs == (RecordedRun("r1"),)
    assert done.deploy == DeployOutcome("ready", None) and done.attempt is None


def test_a_record_of_an_earlier_mlenv_reads_as_ready(home: Path) -> None:
    record = _deployment().to_json()
    assert not {"deploy", "attempt", "leftovers"} & set(record)  # written as an earlier mlenv wrote it
    (home / ".mlenv").mkdir()
    (home / ".mlenv" / "state.json").write_text(json.dumps({"version": 2, "current": "lab",
                                                            "deployments": {"lab": record}}))
    assert state.load().deployments["lab"].deploy == DeployOutcome("ready", None)


def test_every_failed_attempt_stays_in_reach_of_clean() -> None:
    first, second, third = _deployment(), _deployment(hosts=["c", "d"]), _deployment(hosts=["e", "f"])
    state.record(first)
    state.failed("lab", "host b: connection refused")
    state.record(second)  # the file fixed (other hosts): the first attempt's workspaces are kept in reach
    state.update("lab", handle=replace(second.handle, env={"MASTER_ADDR": "c"}))  # the same attempt learns more
    learned = replace(second.handle, env={"MASTER_ADDR": "c"})
    assert state.load().deployments["lab"].handles == (learned, first.handle)
    state.succeeded("lab")
    state.record(third)
    state.failed("lab", "host f: connection refused")
    state.record(third)  # a third try of the same re-deploy
    kept = state.load().deployments["lab"]
    assert kept.handle == learned and kept.deploy.state == "partial"
    assert kept.handles == (learned, third.handle, first.handle)


def test_a_deploy_under_way_is_unfinished_by_its_record_and_said_so_only_where_shown() -> None:
    state.record(_deployment())
    recorded = state.load().deployments["lab"]
    assert recorded.unfinished and recorded.deploy == DeployOutcome("failed", None)
    assert deploy_shown(recorded).to_json() == {"state": "failed", "error": UNFINISHED}
    state.failed("lab", UNFINISHED)  # an error worded as the display text is still an error
    failed = state.load().deployments["lab"]
    assert not failed.unfinished and deploy_shown(failed).error == UNFINISHED
    state.record(_deployment(hosts=["c", "d"]))  # so the failed attempt is a leftover, in reach of clean
    assert state.load().deployments["lab"].handles == (_deployment(hosts=["c", "d"]).handle, _deployment().handle)
