"""deploy's live readiness view at any terminal width from 60 columns: one line per pod, every header whole (at 120
columns rich gave NODE and PHASE no width: `POD ┃┃ ┃ DETAIL`), the details cut first."""

from __future__ import annotations

import re

import pytest
from mlenv.backends.kubeapi.explain import Trouble
from mlenv.backends.kubeapi.naming import KubeHandle
from mlenv.backends.kubeapi.waiting import _view, statefulset_pods
from mlenv.ui import ELLIPSIS
from rich.cells import cell_len

TARGET = KubeHandle("ml-dev-env", "team-ml", 3, "oc", None, "bench", "clusters/bench.yaml", (), "ml-dev-env", None)


def _pod(index: int, node: str, phase: str) -> dict[str, object]:
    return {"metadata": {"name": f"ml-dev-env-{index}"}, "spec": {"nodeName": node}, "status": {"phase": phase}}


@pytest.mark.parametrize("width", [60, 80, 100, 120, None])
def test_every_header_and_one_line_per_pod(width: int | None) -> None:
    found = {0: _pod(0, "gpu-worker-a100-0.cluster.example.internal", "Running"),
             1: _pod(1, "gpu-worker-a100-1.cluster.example.internal", "Pending")}
    why = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu. preemption: 0/12 nodes are available"
    troubles = {"ml-dev-env-1": Trouble("ml-dev-env-1", "Unschedulable", why),
                "statefulset/ml-dev-env": Trouble("statefulset/ml-dev-env", "FailedCreate", "quota exceeded " * 9)}
    lines = _view(statefulset_pods(TARGET), found, {0}, troubles, 12.0)(width, False).splitlines()
    assert lines[0] == "ml-dev-env in team-ml: 1/3 pods ready (12s)"
    assert re.split(r"\s*┃\s*", lines[1].strip()) == ["POD", "NODE", "PHASE", "DETAIL"]
    assert [line.split("│")[0].strip() for line in lines[3:6]] == ["ml-dev-env-1", "ml-dev-env-2", "ml-dev-env-0"]
    assert lines[6].startswith("statefulset/ml-dev-env: quota exceeded") and len(lines) == 7
    if width is not None:
        assert all(cell_len(line) <= width for line in lines), lines
    else:
        assert ELLIPSIS not in "".join(lines) and why in lines[3]
