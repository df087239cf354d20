"""A launch's settings resolved once (ops.launch.settings): the options typed over the deployment's cluster file
(its ``launch:`` section, ``network.expect_transport``) over the defaults, the rules that tie them together, the
cluster file read once per ``mlenv launch`` (opened once, a file that no longer loads warned about once), and a
launch that runs straight (few returns to a module it has left)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, FunctionType, MethodType, ModuleType
from typing import Any

import pytest
from mlenv import state
from mlenv.core.clusters import load_plan
from mlenv.core.registry import get
from mlenv.ops.launch import settings

from tests.helpers import ROOT, invoke

LAUNCH = "launch:\n  hang_timeout: 40\n  idle_minutes: 30m\n  idle_util: 7\n  max_restarts: 3\n  node_silence: 9\n"


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
    assert warnings[0].startswith("WARNING: launch.hang_timeout, launch.idle_minutes, launch.node_silence, "
                                  "network.expect_transport, "
                                  "launch.max_restarts not read: "), warnings
    typed = invoke("launch", "-c", "olivia", "--max-restarts", "1", "--expect-transport", "any", "--dry-run", "t.py")
    assert [line for line in typed.stderr.splitlines() if " not read: " in line] == [
        warnings[0].replace(", network.expect_transport, launch.max_restarts", "")], typed.stderr


def test_the_cluster_file_over_the_defaults_and_what_was_typed_over_both(deployed: Path) -> None:
    nothing_typed: dict[str, Any] = {"hang_timeout": None, "on_hang": None, "on_idle": None,
                                     "expect_transport": None, "max_restarts": None}
    read = settings("olivia", **nothing_typed)
    assert (read.hang_timeout, read.idle_seconds, read.idle_util, read.max_restarts) == (40, 1800, 7, 3)
    assert read.spec("torchrun", "t.py", (), None, False, ()).watchdog_options()[-2:] == ["--node-silence", "9"]
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
    assert "--node-silence" not in default.spec("torchrun", "t.py", (), None, False, ()).watchdog_options()


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


RETURNS_AT_MOST = 6
"""Issue 27: following ``mlenv launch``'s cluster argument through the calls, at most 6 returns to a module
already left (29 before ops.launch.LaunchSettings)."""
UNFOLLOWED = (type(None), bool, int, float, type, ModuleType, FunctionType, MethodType)


class Followed:
    """A profile function (sys.setprofile) following one cluster reference through mlenv's calls: the calls of
    hand-written mlenv functions that receive it, or an object made from it (what such a call returned, and that
    object's members two levels down), up to the backend: what a backend's verb does inside is its own."""

    def __init__(self, cluster_ref: str) -> None:
        self.cluster_ref = cluster_ref
        self.made: dict[int, Any] = {}
        """id -> object made from the reference (kept, so that no id is reused)."""
        self.following: set[int] = set()
        """The frames of followed calls whose return value is made from the reference."""
        self.backend: FrameType | None = None
        """The frame of the backend verb being run, if any: nothing under it is followed."""
        self.modules: list[str] = []
        """The module of each followed call, in order."""

    def make(self, value: Any, depth: int = 2) -> None:
        if isinstance(value, UNFOLLOWED) or id(value) in self.made:
            return
        self.made[id(value)] = value
        if depth == 0 or isinstance(value, (str, bytes)):
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            members = list(value)
        elif isinstance(value, dict):
            members = list(value.values())
        elif dataclasses.is_dataclass(value):
            members = [getattr(value, field.name) for field in dataclasses.fields(value)]
        else:
            members = list(getattr(value, "__dict__", {}).values())
        for member in members:
            self.make(member, depth - 1)

    def receives(self, frame: FrameType) -> bool:
        code = frame.f_code
        named = code.co_argcount + code.co_kwonlyargcount
        values = [frame.f_locals.get(name) for name in code.co_varnames[:named]]
        if code.co_flags & inspect.CO_VARARGS:
            values += frame.f_locals.get(code.co_varnames[named], ())
        if code.co_flags & inspect.CO_VARKEYWORDS:
            values += frame.f_locals.get(code.co_varnames[named + bool(code.co_flags & inspect.CO_VARARGS)],
                                         {}).values()
        return any(value == self.cluster_ref if isinstance(value, str) else id(value) in self.made
                   for value in values)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        module = str(frame.f_globals.get("__name__", ""))
        if event == "return" and frame is self.backend:
            self.backend = None
        if self.backend is not None or not module.startswith("mlenv."):
            return
        code = frame.f_code
        written = not (code.co_name.startswith("<") or "__create_fn__" in code.co_qualname)  # no dataclass code
        if event == "call" and written and self.receives(frame):
            self.following.add(id(frame))
            self.modules.append(module)
            if module.startswith("mlenv.backends."):
                self.backend = frame
        elif event == "return" and id(frame) in self.following:
            self.following.discard(id(frame))
            self.make(arg)

    def visits(self) -> list[str]:
        """The modules the followed path went through, in order (consecutive calls in one module: one visit)."""
        return [module for i, module in enumerate(self.modules) if i == 0 or self.modules[i - 1] != module]

    def returns(self) -> list[str]:
        """Each time the followed path comes back to a module it had left."""
        visits = self.visits()
        return [f"{i}: {module}" for i, module in enumerate(visits) if module in visits[:i]]


def test_a_launch_runs_straight(deployed: Path) -> None:
    assert invoke("launch", "-c", "olivia", "--dry-run", "train.py").exit_code == 0  # imports and caches warm
    followed = Followed("olivia")
    sys.setprofile(followed)
    try:
        result = invoke("launch", "-c", "olivia", "--dry-run", "train.py")
    finally:
        sys.setprofile(None)
    assert result.exit_code == 0 and "#SBATCH" in result.stdout, result.output
    visits = followed.visits()  # from the command to the backend
    assert visits[:3] == ["mlenv.cli", "mlenv.cli.commands", "mlenv.ops.launch"], visits  # reports_errors, launch
    assert visits[-1] == "mlenv.backends.slurm.backend", visits
    assert len(followed.returns()) <= RETURNS_AT_MOST, (followed.returns(), visits)
