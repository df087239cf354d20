"""Every backend reads its recorded handle through ``Handle.decoded``: a record of another shape (an older mlenv,
a hand edit) is one UsageError naming the deployment and the fix, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mlenv import state
from mlenv.backends.kubernetes.backend import KubernetesBackend
from mlenv.backends.local.backend import LocalBackend
from mlenv.backends.runai.backend import RunaiBackend
from mlenv.backends.slurm.backend import job_from
from mlenv.backends.ssh.target import SshTarget
from mlenv.core.capabilities import Handle
from mlenv.core.clusters import load_plan
from mlenv.core.registry import get
from mlenv.errors import UsageError

from tests.helpers import ROOT

READERS: dict[str, Callable[[Handle], Any]] = {
    "kubernetes": KubernetesBackend.target, "local": LocalBackend.layout, "runai": RunaiBackend.workload,
    "slurm": job_from, "ssh": SshTarget.of}


@pytest.mark.parametrize("backend", sorted(READERS))
@pytest.mark.parametrize(("data", "problem"), [
    ({}, "KeyError("), ({"pods": 3, "job": 3, "hosts": 3, "base": 1, "app": 1, "owner": 1}, "Error("),
])
def test_a_record_of_another_shape_is_one_usage_error(backend: str, data: dict[str, Any], problem: str) -> None:
    handle = Handle(backend, "lab", 2, "tcp", False, {}, data)
    with pytest.raises(UsageError) as raised:
        READERS[backend](handle)
    message = str(raised.value)
    assert message.startswith(f"the recorded deployment lab is not a {backend} deployment of this mlenv (")
    assert problem in message and message.endswith("); remove it from .mlenv/state.json")


FILES = {"kubernetes": "template.yaml", "local": "local.yaml", "runai": "rcp.yaml", "slurm": "olivia.yaml",
         "ssh": "lab.yaml"}
"""A cluster file of the repository whose prepared handle each reader reads (template.yaml: OpenShift, whose
handles the Kubernetes backend reads)."""


@pytest.mark.parametrize("backend", sorted(READERS))
def test_a_handle_is_decoded_once_whoever_asks(backend: str, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """Every verb and helper handed one handle gets the one typed view, made the first time; a changed handle (a
    new object) is decoded afresh, and the view never reaches the handle's record."""
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    job = load_plan(str(ROOT / "clusters" / FILES[backend]))
    handle = get(job.cluster.backend, state.RECORDS).deploy.prepare(job).handle
    record = handle.to_json()
    view = READERS[backend](handle)
    assert READERS[backend](handle) is view
    assert READERS[backend](replace(handle, name=handle.name)) is not view
    assert handle.to_json() == record and "_views" not in json.dumps(record)
