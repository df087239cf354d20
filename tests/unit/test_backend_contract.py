"""The contract every registered backend keeps, checked fast and without any cluster: ``prepare(plan)`` and
``prepare_launch(handle, spec)`` are pure (docs/architecture.md): no subprocess, no socket, no write, no environment
read, no file read outside this repository, and two calls give the same request byte for byte.

The plans come from the repository's own cluster files (clusters/, tests/fixtures/clusters/) through the real loader
and planner (``core.clusters.load_plan``), in every network mode the file allows; a backend with no file of its own
there (kubernetes) gets the template's text with its ``backend:`` line changed, planned the same way in memory.
Launches are prepared on the handle ``prepare`` gives (what ``launch --dry-run`` of an undeployed cluster file uses,
``ops.target.resolve``) and on that handle as ``.mlenv/state.json`` gives it back; Slurm also on the handle its
``apply`` records once the allocation is submitted (``allocation: {id, digest}``, the shape its own tests use).

Backends are made through the registry, as every command makes them, under the guard's lenient form (no process, no
network): that is where a backend reads what it needs of this machine (local: ``$MLENV_HOME`` or the working
directory, and whether it is root with ``ip`` on the PATH; ssh: the uid; Slurm is handed mlenv's records but reads
none here; the Kubernetes family and Run:ai find their CLI only when a verb needs it). The first call of each verb
is as lenient: it may fill mlenv's on-disk caches (compiled validators and templates, kept like ``.pyc`` files),
import lazily and read the environment for those caches' place; the two calls after it run under the full guard
and must give exactly what the first gave.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import mlenv
import pytest
from mlenv import state
from mlenv.config.load import parse_yaml
from mlenv.core.capabilities import Handle, LaunchRequest, LaunchSpec, Node, Request
from mlenv.core.clusters import load_plan, validate
from mlenv.core.registry import BACKENDS, get
from mlenv.errors import UsageError
from mlenv.plan import JobPlan, plan

ROOT = Path(__file__).resolve().parents[2]
READABLE = (str(ROOT) + os.sep, str(Path(mlenv.__file__).resolve().parent) + os.sep)
"""Where a pure verb may read (the repository's files, mlenv's own package wherever it is installed)."""
FILES = sorted([*ROOT.glob("clusters/*.yaml"), *ROOT.glob("tests/fixtures/clusters/*.yaml")])
DERIVED = {"kubernetes": ("clusters/template.yaml", "backend: openshift\n", "backend: kubernetes\n")}
"""Backends without a cluster file of their own in the repository: (file, its line, the line in its place)."""
SPECS = (
    LaunchSpec("torchrun", "train.py", ("--steps", "5", "a b;c"), nproc=2, run_id="RUN"),
    LaunchSpec("deepspeed", "train.py", run_id="RUN", secrets=("HF_TOKEN",), expect_transport="sockets"),
    LaunchSpec("torchrun", "train.py", run_id="RUN", detach=True, max_restarts=1, attempt=1, hang_timeout=60,
               on_hang="stop", idle_seconds=600, idle_util=5.0, on_idle="stop"),
)
"""An attached launch, one forwarding a secret (refused by a Slurm batch job: the refusal must be pure too) and a
detached one restarting, with its watches."""
OUTSIDE = ("subprocess.", "socket.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.kill",
           "os.putenv", "os.unsetenv", "urllib.", "http.")
"""Audit events (sys.addaudithook) no call of a pure verb may raise, not even the first: processes, the network."""
CHANGES = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.truncate", "os.chmod",
           "os.chown", "os.utime", "shutil.", "ctypes.")
"""Audit events changing files or loading C libraries, which only a first call may raise (filling mlenv's on-disk
caches, importing: the runtime's rank module loads libc)."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
Prepared = TypeVar("Prepared", Request, LaunchRequest)


class Impure(AssertionError):
    """What a pure verb did that it must not."""


_guard: tuple[list[str], bool] | None = None
"""While the guard is on: what it refused, and whether it is strict (None: off)."""
_hooked: list[bool] = []
"""Whether the audit hook is in (once in, it stays for the process: it does nothing while the guard is off)."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _guard is None:
        return
    if event.startswith(OUTSIDE):
        _refuse(f"{event} {args!r:.200}")
    if not _guard[1]:
        return
    if event in ("open", "os.listdir", "os.scandir"):
        path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else repr(args[0])
        mode, flags = (args[1], args[2]) if event == "open" else (None, 0)
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & WRITE_FLAGS)
        if writes or not os.path.abspath(path).startswith(READABLE):
            _refuse(f"{event} {path} {mode or oct(flags)}")
    elif event.startswith(CHANGES):
        _refuse(f"{event} {args!r:.200}")


def _refuse(what: str) -> None:
    assert _guard is not None
    _guard[0].append(what)
    raise Impure(what)


class _NoEnviron(Mapping[str, str]):
    """``os.environ`` while the guard is on: any read is refused (and kept, should the verb swallow the error)."""

    def __getitem__(self, key: str) -> str:
        _refuse(f"environment read {key}")
        raise AssertionError  # unreachable: _refuse raises

    def __iter__(self) -> Iterator[str]:
        _refuse("environment listed")
        raise AssertionError

    def __len__(self) -> int:
        _refuse("environment size")
        raise AssertionError


@contextmanager
def _guarded(monkeypatch: pytest.MonkeyPatch, strict: bool = True) -> Iterator[list[str]]:
    """Every impure act refused and listed, for the block's duration; not ``strict``: only processes and the
    network (a first call may read the environment and fill mlenv's caches)."""
    global _guard
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    seen: list[str] = []
    with monkeypatch.context() as patched:
        if strict:
            patched.setattr(os, "environ", _NoEnviron())
        _guard = (seen, strict)
        try:
            yield seen
        finally:
            _guard = None


def _outcome(verb: Callable[..., Prepared], *args: object) -> Prepared | str:
    """``verb(*args)``, or the one-line refusal (UsageError) it answers with."""
    try:
        return verb(*args)
    except UsageError as refused:
        return f"UsageError: {refused}"


def _same_twice(monkeypatch: pytest.MonkeyPatch, verb: Callable[..., Prepared], *args: object) -> Prepared | str:
    """``verb(*args)`` once as a command would (caches filled; no process, no network), then twice under the full
    guard: both times exactly the first's answer (dataclasses equal field by field: text, files, payload,
    handle...), doing nothing impure."""
    with _guarded(monkeypatch, strict=False) as seen:
        first = _outcome(verb, *args)
    assert seen == [], f"impure: {seen}"
    for _ in range(2):
        with _guarded(monkeypatch) as seen:
            again = _outcome(verb, *args)
        assert seen == [], f"impure: {seen}"
        assert again == first
        assert isinstance(again, str) or isinstance(first, str) or again.text.encode() == first.text.encode()
    return first


def _plans(source: str) -> Iterator[JobPlan]:
    """The plans of cluster file ``source`` (relative to the repository) in each mode it allows, or of a backend
    in ``DERIVED``."""
    if source in DERIVED:
        name, line, instead = DERIVED[source]
        text = (ROOT / name).read_text()
        assert line in text, f"{name} no longer has {line!r}: change DERIVED"
        cluster = validate(parse_yaml(text.replace(line, instead, 1), f"{name} as {source}"))
        yield from (plan(cluster, mode) for mode in (("rdma", "tcp") if cluster.rdma.enabled else ("tcp",)))
        return
    first = load_plan(str(ROOT / source))
    yield from (load_plan(str(ROOT / source), mode) for mode in (("rdma", "tcp") if first.cluster.rdma.enabled
                                                                 else ("tcp",)))


SOURCES = [str(path.relative_to(ROOT)) for path in FILES] + sorted(DERIVED)


def test_every_registered_backend_has_a_cluster_file_here() -> None:
    covered = {load_plan(str(path)).cluster.backend for path in FILES} | set(DERIVED)
    assert covered == set(BACKENDS), "a registered backend has no cluster file here: add one, or a DERIVED entry"


@pytest.mark.parametrize("source", SOURCES)
def test_prepare_and_prepare_launch_are_pure(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for job in _plans(source):
        with _guarded(monkeypatch, strict=False) as seen:  # made as every command makes it: no process, no network
            backend = get(job.cluster.backend, state.RECORDS)
        assert seen == [], f"impure: {seen}"
        request = _same_twice(monkeypatch, backend.deploy.prepare, job)
        assert not isinstance(request, str), request
        assert request.text and request.handle.backend == backend.name
        recorded = Handle.from_json(json.loads(json.dumps(request.handle.to_json())))
        handles = [request.handle, recorded]
        if backend.name == "slurm":  # after deploy: the allocation submitted, as apply records it
            handles.append(replace(request.handle, data={**request.handle.data,
                                                         "allocation": {"id": "4242", "digest": "0" * 64}}))
        for spec in SPECS:
            for handle in handles:
                launch = _same_twice(monkeypatch, backend.jobs.prepare_launch, handle, spec)
                if handle is recorded:  # what state.json gives back prepares the same launch as the dry run
                    assert launch == _outcome(backend.jobs.prepare_launch, request.handle, spec)
                batch = backend.name == "slurm" and not handle.data.get("allocation")
                assert isinstance(launch, str) == (batch and bool(spec.secrets)), launch  # only a batch job refuses
                assert isinstance(launch, str) or (launch.text and launch.spec == spec), launch


@pytest.mark.parametrize("impure", [
    lambda: subprocess.run(["true"], check=False),
    lambda: __import__("socket").socket(),
    lambda: os.environ.get("HOME"),
    lambda: "HOME" in os.environ,
    lambda: open(os.devnull, "w"),  # noqa: SIM115 -- refused before it opens
    lambda: os.open(str(ROOT / "pyproject.toml"), os.O_RDWR),
    lambda: open("/etc/hostname"),  # noqa: SIM115 -- outside the repository
], ids=["subprocess", "socket", "environ.get", "environ-in", "open-w", "os.open-rw", "read-outside"])
def test_the_guard_refuses_what_is_impure(impure: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> None:
    with _guarded(monkeypatch) as seen, pytest.raises(Impure):
        impure()
    assert len(seen) == 1
    with _guarded(monkeypatch) as seen:
        assert (ROOT / "pyproject.toml").read_text()  # reading the repository is allowed
    assert seen == []


def test_a_first_call_may_fill_caches_but_never_reaches_outside(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    with _guarded(monkeypatch, strict=False) as seen:
        assert os.environ.get("PATH")
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "compiled").write_text("")
        with pytest.raises(Impure):
            subprocess.run(["true"], check=False)
    assert len(seen) == 1 and seen[0].startswith("subprocess.Popen")


@pytest.mark.parametrize("source", ["clusters/lab.yaml", "clusters/local.yaml"])
def test_exec_argv_and_copy_target_only_build_command_lines(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ssh's and the local backend's ``exec_argv`` and ``copy_target`` are pure too: ssh's ssh_config is written by
    deploy and by ``nodes``, where every verb that reaches the hosts starts; what the local pods' commands get of
    this machine's environment is read when the backend is made."""
    job = load_plan(str(ROOT / source))
    with _guarded(monkeypatch, strict=False):
        backend = get(job.cluster.backend, state.RECORDS)
    handle = backend.deploy.prepare(job).handle
    if backend.name == "ssh":  # deployed: each machine's workspace learned
        machines = len(handle.data["hosts"]) + len(handle.data.get("spares", ()))
        handle = replace(handle, data={**handle.data, "workspaces": [f"/srv/w{i}" for i in range(machines)]})
    node = Node(1, "node-1", "/srv/w1")
    calls: list[Callable[[], object]] = [
        lambda: backend.access.exec_argv(handle, node, ["python3", "-c", "print(1)"], env={"A": "b"},
                                         stop_on_stdin_eof=True, secrets=("HF_TOKEN",)),
        lambda: backend.access.exec_argv(handle, node, ["bash"], interactive=True),
        lambda: backend.access.copy_target(handle, node)]
    for call in calls:
        with _guarded(monkeypatch) as seen:
            first = call()
            assert call() == first
        assert seen == [], f"impure: {seen}"
