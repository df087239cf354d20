"""Every backend reads its recorded handle through ``Handle.decoded``: a record of another shape (an older mlenv,
a hand edit) is one UsageError naming the deployment and the fix, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from mlenv.backends.kubernetes.backend import KubernetesBackend
from mlenv.backends.local.backend import LocalBackend
from mlenv.backends.runai.backend import RunaiBackend
from mlenv.backends.slurm.backend import job_from
from mlenv.backends.ssh.target import SshTarget
from mlenv.core.capabilities import Handle
from mlenv.errors import UsageError

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
