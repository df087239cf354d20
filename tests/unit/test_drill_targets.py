"""``drill.targets`` of a cluster file: read over the drill's defaults (ops.drill.targets_of, from a recorded
deployment as ``mlenv drill`` reads it); a value that is not a positive number of seconds, or an unknown target, is
a validation error naming the field (exit 2); a preemption's checkpoint is due within half its grace; and the
timeline picture the drill writes is a PNG."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from mlenv import state
from mlenv.core.clusters import load_plan
from mlenv.core.registry import get
from mlenv.ops.drill import HANG_TIMEOUT, Targets, targets_of
from mlenv.ops.plot import write_timeline
from mlenv.ops.target import resolve

from tests.helpers import ROOT, run_mlenv


def _project(tmp_path: Path, drill: str) -> Path:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    cluster_file = tmp_path / "clusters" / "local.yaml"
    shutil.copy(ROOT / "clusters" / "local.yaml", cluster_file)
    with cluster_file.open("a") as appended:
        appended.write(drill)
    return cluster_file


def test_the_file_overrides_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster_file = _project(tmp_path, "drill:\n  targets:\n    lost_node: 30\n    resumed: 60.5\n")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    plan = load_plan("local")
    handle = get(plan.cluster.backend, state.RECORDS).deploy.prepare(plan).handle
    state.record(state.Deployment(handle.name, handle.backend, str(cluster_file), plan.mode, plan.nodes, None,
                                  handle))
    state.succeeded(handle.name)
    targets = targets_of(resolve(None))
    assert targets == Targets(lost_node=30.0, resumed=60.5)
    assert [targets.of(fault, "detected") for fault in ("rank-kill", "node-freeze", "hang")] == \
        [5.0, 30.0, HANG_TIMEOUT + 30.0]
    assert (targets.of("rank-exit", "resumed"), targets.of("rank-exit", "stopped")) == (60.5, None)
    assert targets.of("preempt", "checkpointed") is None  # the grace is the preemption's, as it was done
    assert replace(targets, grace=40.0).of("preempt", "checkpointed") == 20.0  # its checkpoint: within half


@pytest.mark.parametrize(("drill", "field"), [
    ("drill:\n  targets:\n    dead_rank: 0\n", "drill.targets.dead_rank"),
    ("drill:\n  targets:\n    resumed: soon\n", "drill.targets.resumed"),
    ("drill:\n  targets:\n    detected: 3\n", "drill.targets.detected"),
])
def test_a_bad_target_is_named(tmp_path: Path, drill: str, field: str) -> None:
    _project(tmp_path, drill)
    result = run_mlenv("validate", "--json", "local", home=tmp_path, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert field in result.stdout, result.stdout


def test_the_timeline_is_a_png(tmp_path: Path) -> None:
    path = write_timeline(tmp_path / "timeline.png", [(0, [(-5.0, 1.2, 0), (4.0, 20.0, 1)]), (1, [(-5.0, 0.1, 0)])],
                          [("FAULT", 0.0), ("DETECTED", 0.1), ("RESUMED", 6.0)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
