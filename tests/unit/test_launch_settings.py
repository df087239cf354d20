"""A launch's settings resolved once (ops.launch.settings): the options typed over the deployment's cluster file
(its ``launch:`` section, ``network.expect_transport``) over the defaults, the rules that tie them together, and
the cluster file read once per ``mlenv launch``: opened once, a file that no longer loads warned about once."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlenv import state
from mlenv.core.clusters import load_plan
from mlenv.core.registry import get
from mlenv.ops.launch import settings

from tests.helpers import ROOT, invoke

LAUNCH = "launch:\n  hang_timeout: 40\n  idle_minutes: 30m\n  idle_util: 7\n  max_restarts: 3\n"


@pytest.fixture
def deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """clusters/olivia.yaml (a Slurm cluster, with a ``launch:`` section) recorded as deployed, as a deploy records
    it, in a project that is the current directory; the cluster file's path."""
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    cluster_file = tmp_path / "clusters" / "olivia.yaml"
    shutil.copy(ROOT / "clusters" / "olivia.yaml", cluster_file)
    with cluster_file.open("a") as appended:
        appended.write(LAUNCH)
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    plan = load_plan("olivia")
    handle = get(plan.cluster.backend, state.RECORDS).deploy.prepare(plan).handle
    state.record(state.Deployment(handle.name, handle.backend, str(cluster_file), plan.mode, plan.nodes, None,
                                  handle))
    state.succeeded(handle.name)
    return cluster_file


COLLECTING: list[list[tuple[str, Any]]] = []
"""The list the audit hook adds this process's open events to while a test collects them (a hook stays)."""
HOOKED: list[bool] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and COLLECTING:
        COLLECTING[-1].append((os.fspath(args[0]) if isinstance(args[0], (str, Path)) else "", args[1]))


@pytest.fixture
def opens() -> Iterator[list[tuple[str, Any]]]:
    """The files opened while the test runs: (path, mode), mode None for os.open."""
    if not HOOKED:
        sys.addaudithook(_hook)
        HOOKED.append(True)
    events: list[tuple[str, Any]] = []
    COLLECTING.append(events)
    try:
        yield events
    finally:
        COLLECTING.remove(events)


def times_opened(events: list[tuple[str, Any]], path: Path) -> int:
    """How often ``path`` was opened: an open() with an opener that calls os.open is one open (two events)."""
    count, previous, wanted = 0, ("", None), os.path.realpath(path)
    for name, mode in events:
        opener_of_previous = mode is None and previous[0] == name and previous[1] is not None
        if name and os.path.realpath(name) == wanted and not opener_of_previous:
            count += 1
        previous = (name, mode)
    return count


def test_a_dry_run_on_a_deployed_cluster_opens_its_file_and_the_state_once(deployed: Path,
                                                                           opens: list[tuple[str, Any]]) -> None:
    state.exclude("olivia", {1: ("gpu-7", "a node fault")})
    opens.clear()
    result = invoke("launch", "-c", "olivia", "--dry-run", "train.py")
    assert result.exit_code == 0, result.output
    assert "#SBATCH" in result.stdout and "--exclude=gpu-7" in result.stdout  # the excluded node, as read with it
    assert times_opened(opens, deployed) == 1, opens
    assert times_opened(opens, state.state_file()) == 1, opens


def test_a_cluster_file_that_no_longer_loads_is_warned_about_once(deployed: Path) -> None:
    deployed.write_text(deployed.read_text().replace("backend: slurm", "backend: [slurm"))
    result = invoke("launch", "-c", "olivia", "--dry-run", "train.py")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if " not read: " in line]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("WARNING: launch.hang_timeout, launch.idle_minutes, network.expect_transport, "
                                  "launch.max_restarts not read: "), warnings
    typed = invoke("launch", "-c", "olivia", "--max-restarts", "1", "--expect-transport", "any", "--dry-run", "t.py")
    assert [line for line in typed.stderr.splitlines() if " not read: " in line] == [
        warnings[0].replace(", network.expect_transport, launch.max_restarts", "")], typed.stderr


def test_the_cluster_file_over_the_defaults_and_what_was_typed_over_both(deployed: Path) -> None:
    nothing_typed: dict[str, Any] = {"hang_timeout": None, "on_hang": None, "on_idle": None,
                                     "expect_transport": None, "max_restarts": None}
    read = settings("olivia", **nothing_typed)
    assert (read.hang_timeout, read.idle_seconds, read.idle_util, read.max_restarts) == (40, 1800, 7, 3)
    assert read.target.recorded is not None and read.run_id.endswith("-olivia")
    typed = settings(None, **{**nothing_typed, "hang_timeout": 5.0, "on_hang": "stop", "on_idle": "stop",
                              "expect_transport": "sockets", "max_restarts": 0})
    assert (typed.hang_timeout, typed.on_hang, typed.on_idle, typed.expect_transport, typed.max_restarts) == (
        5.0, "stop", "stop", "sockets", 0)
    spec = typed.spec("torchrun", "train.py", ("--steps", "3"), 2, False, ())
    assert (spec.run_id, spec.hang_timeout, spec.idle_seconds, spec.idle_util, spec.max_restarts) == (
        typed.run_id, 5.0, 1800, 7, 0)
    deployed.write_text(deployed.read_text().replace(LAUNCH, ""))
    default = settings(None, **nothing_typed)
    assert (default.hang_timeout, default.idle_seconds, default.idle_util, default.max_restarts) == (
        None, None, None, 0)


@pytest.mark.parametrize(("options", "message"), [
    (["--hang-timeout", "0"], "error: --hang-timeout: expected a positive number of seconds, got 0"),
    (["--hang-timeout", "inf"], "error: --hang-timeout: expected a positive number of seconds, got inf"),
    (["--on-hang", "stop"], "error: --on-hang stop needs a hang timeout: --hang-timeout SECONDS (or "
                            "launch.hang_timeout)"),
    (["--on-idle", "warn"], "error: --on-idle warn needs launch.idle_minutes in the cluster file (e.g. "
                            "idle_minutes: 30m)"),
])
def test_options_that_do_not_go_together_are_refused(deployed: Path, options: list[str], message: str) -> None:
    deployed.write_text(deployed.read_text().replace(LAUNCH, ""))
    result = invoke("launch", "-c", "olivia", *options, "--dry-run", "train.py")
    assert (result.exit_code, result.stderr.strip()) == (2, message)
