"""`mlenv sync` for real, to local pods: incremental, excludes, .mlenvignore, --delete only when asked, the
in-pod runtime shipped (and never shadowed), one copy for a shared (RWX) workspace, the tar stream when a pod has
no rsync, unreadable files named, sparse files kept sparse, file/directory conflicts, progress lines."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from mlenv.backends.local.backend import LocalBackend
from mlenv.core.capabilities import CopyTarget, Handle, Node
from mlenv.ops.sync import PACKAGE, sync
from mlenv.ops.target import resolve

from tests._prereq import require
from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject, make_project, require_local

FILES = {
    "train.py": "print('hi')\n",
    "data/config.json": "{}\n",
    "data/big.ckpt": "weights\n",
    "logs/run.log": "old\n",
    ".git/HEAD": "ref\n",
    "pkg/__pycache__/m.cpython-311.pyc": "x",
    "pkg/m.pyc": "x",
    "pkg/m.py": "x = 1\n",
    ".DS_Store": "x",
    ".mlenvignore": "*.ckpt\nlogs/\n",
}


def _sync(project: LocalProject, source: Path, *extra: str) -> dict[str, object]:
    return dict(json.loads(project.ok("sync", "--cluster", project.name, "--source", str(source), "--json",
                                      *extra).stdout))


def _tree(root: Path) -> set[str]:
    relative = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
    return {str(p) for p in relative if p.parts[0] != ".mlenv"}


def _run(project: LocalProject, *args: str, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """The real `mlenv` against ``project``, started through ``prefix``."""
    return subprocess.run([*prefix, str(MLENV), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MLENV_HOME": str(project.home)}, check=False)


def _failed_sync(project: LocalProject, source: Path, *extra: str,
                 prefix: Sequence[str] = ()) -> list[dict[str, object]]:
    """The pods of a `sync --json` that must exit 1 with nothing but JSON on stdout."""
    result = _run(project, "sync", "--cluster", project.name, "--source", str(source), "--json", *extra,
                  prefix=prefix)
    assert result.returncode == 1, f"{result.returncode}\n{result.stdout}\n{result.stderr}"
    return list(json.loads(result.stdout)["pods"])


def _runtime(root: Path) -> dict[str, bytes]:
    """The runtime files under ``root`` (an mlenv package directory), without bytecode."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _held_to_file_modes() -> list[str]:
    """A command prefix under which even root obeys file modes, as every other user does (no CAP_DAC_OVERRIDE,
    no CAP_DAC_READ_SEARCH), so that a chmod 000 file cannot be read; nothing for other users."""
    if os.geteuid() != 0:
        return []
    require("setpriv")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path, "lsy", "10.77.63.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    yield deployed
    deployed.mlenv("clean", "--cluster", deployed.name, "--delete-data", "--yes")


def test_incremental_with_excludes_and_runtime(project: LocalProject) -> None:
    source = project.source(FILES)
    first = _sync(project, source)
    assert first["ok"] and [p["method"] for p in first["pods"]] == ["rsync", "rsync"]  # type: ignore[union-attr]
    for ordinal in (0, 1):
        workspace = project.pod_dir(ordinal) / "workspace"
        assert _tree(workspace) == {"train.py", "data/config.json", "pkg/m.py", ".mlenvignore"}
        assert (workspace / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
        assert not list((workspace / ".mlenv").rglob("__pycache__"))
    second = _sync(project, source)
    assert [p["files"] for p in second["pods"]] == [0, 0]  # type: ignore[union-attr]
    (source / "train.py").write_text("print('changed')\n")
    third = _sync(project, source)
    assert [p["files"] for p in third["pods"]] == [1, 1]  # type: ignore[union-attr]


def test_delete_only_when_asked(project: LocalProject) -> None:
    source = project.source(FILES)
    _sync(project, source)
    (source / "train.py").unlink()
    _sync(project, source)
    workspace = project.pod_dir(1) / "workspace"
    assert (workspace / "train.py").is_file()
    _sync(project, source, "--delete")
    assert not (workspace / "train.py").exists()
    assert (workspace / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()  # the runtime survives


def test_shared_workspace_is_synced_once(tmp_path: Path) -> None:
    require_local("processes")
    shared = make_project(tmp_path, "lsh", "10.77.64.0/24", "processes", storage="storage:\n  mode: rwx\n")
    shared.ok("deploy", shared.name)
    try:
        report = _sync(shared, shared.source({"train.py": "x\n"}))
        methods = [p["method"] for p in report["pods"]]  # type: ignore[union-attr]
        assert methods == ["rsync", f"shared with {shared.app}-0"]
        out = shared.ok("exec", "--cluster", shared.name, "--", "sh", "-c", "pwd; ls").stdout
        assert out.count("shared-workspace") == 2 and out.count("train.py") == 2
        report = _sync(shared, shared.source({"train.py": "x\n"}), "--delete")
        assert [p["result"] for p in report["pods"]] == ["ok", "ok"]  # type: ignore[union-attr]
        owner = tmp_path / ".mlenv" / "local" / "lsh-ns" / "shared-workspace" / ".mlenv" / "owner"
        assert owner.is_file()  # the owner mark outlives --delete, so that clean still knows the workspace
    finally:
        shared.mlenv("clean", "--cluster", shared.name, "--delete-data", "--yes")
    assert not (tmp_path / ".mlenv" / "local" / "lsh-ns").exists()


class NoRsyncPods(LocalBackend):
    """Local pods reached through a remote shell whose PATH has no rsync: sync must stream tar over exec."""

    def __init__(self, tools: Path) -> None:
        super().__init__()
        self.tools = tools

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        return CopyTarget(destination=f"{node.name}:{node.workspace}/", rsh=["false"])

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        return super().exec_argv(handle, node, argv, env={**(env or {}), "PATH": str(self.tools)})


def test_tar_stream_when_the_pod_has_no_rsync(project: LocalProject, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "tar", "mkdir", "rm", "date"):
        (tools / tool).symlink_to(next(Path(d) / tool for d in os.environ["PATH"].split(os.pathsep)
                                       if (Path(d) / tool).is_file()))
    monkeypatch.setenv("MLENV_HOME", str(project.home))
    handle = resolve(project.name).handle
    source = project.source({**FILES, ".mlenvignore": "*.ckpt\nlogs/\nruntime/\n",
                             ".mlenv/mlenv/runtime/__main__.py": "raise SystemExit('shadowed')\n"})
    report = sync(NoRsyncPods(tools), handle, source=source, as_json=True)
    assert report.ok and [p.method for p in report.pods] == ["tar", "tar"]
    workspace = project.pod_dir(1) / "workspace"
    assert _tree(workspace) == {"train.py", "data/config.json", "pkg/m.py", ".mlenvignore"}
    runtime = workspace / ".mlenv" / "mlenv"
    (runtime / "runtime" / "stale.py").write_text("not shipped by this mlenv\n")
    (workspace / ".mlenv" / "runs" / "job-1").mkdir(parents=True)
    (workspace / ".mlenv" / "runs" / "job-1" / "output.log").write_text("a running job\n")
    report = sync(NoRsyncPods(tools), handle, source=source, delete=True, as_json=True)
    assert report.ok and {p.method for p in report.pods} == {"tar (no rsync on the node: copies all, cannot --delete)"}
    assert _runtime(runtime) == {"__init__.py": (PACKAGE / "__init__.py").read_bytes(),
                                 **{f"runtime/{k}": v for k, v in _runtime(PACKAGE / "runtime").items()}}
    assert (workspace / ".mlenv" / "runs" / "job-1" / "output.log").read_text() == "a running job\n"
    (source / "data" / "secret.bin").write_text("s")
    (source / "data" / "secret.bin").chmod(0)
    script = ("import sys; from pathlib import Path; from mlenv.ops.sync import sync; "
              "from mlenv.ops.target import resolve; from tests.integration.test_local_sync import NoRsyncPods; "
              "sync(NoRsyncPods(Path(sys.argv[1])), resolve(sys.argv[2]).handle, source=Path(sys.argv[3]), "
              "as_json=True)")
    result = subprocess.run([*_held_to_file_modes(), sys.executable, "-c", script, str(tools), project.name,
                             str(source)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert [(p["method"], p["ok"], p["result"]) for p in json.loads(result.stdout)["pods"]] == [
        ("tar", False, "partial: 1 file could not be read: data/secret.bin")] * 2, result.stderr


def test_an_unreadable_file_is_named_and_everything_else_is_copied(project: LocalProject) -> None:
    source = project.source(FILES)
    _sync(project, source)
    (source / "train.py").write_text("print('changed')\n")
    secret = source / "data" / "secret.bin"
    secret.write_text("s" * 100)
    secret.chmod(0)
    pods = _failed_sync(project, source, prefix=_held_to_file_modes())
    assert [(p["ok"], p["files"], p["bytes"], p["unreadable"], p["result"]) for p in pods] == [
        (False, 1, len("print('changed')\n"), ["data/secret.bin"],
         "partial: 1 file could not be read: data/secret.bin")] * 2
    for ordinal in (0, 1):
        workspace = project.pod_dir(ordinal) / "workspace"
        assert (workspace / "train.py").read_text() == "print('changed')\n"
        assert not (workspace / "data" / "secret.bin").exists()
    table = _run(project, "sync", "--cluster", project.name, "--source", str(source), prefix=_held_to_file_modes())
    assert table.returncode == 1
    assert table.stdout.count("partial: 1 file could not be read: data/secret.bin") == 2, table.stdout


def test_sparse_files_stay_sparse(project: LocalProject) -> None:
    source = project.source({"train.py": "x\n"})
    with (source / "disk.img").open("wb") as image:
        image.truncate(100 * 2**20)
        image.seek(50 * 2**20)
        image.write(b"data")
    assert (source / "disk.img").stat().st_blocks * 512 <= 2**20, "this file system keeps no sparse files"
    _sync(project, source)
    for ordinal in (0, 1):
        copied = (project.pod_dir(ordinal) / "workspace" / "disk.img").stat()
        assert copied.st_size == 100 * 2**20 and copied.st_blocks * 512 <= 2**20


def test_a_file_and_a_directory_of_one_name_swap_only_with_delete(project: LocalProject) -> None:
    source = project.source(FILES)
    _sync(project, source)
    node = project.pod_dir(0) / "workspace"
    (node / "results").write_text("made on the node\n")  # a file on node 0, a directory here
    (source / "results").mkdir()
    (source / "results" / "r.txt").write_text("r\n")
    (node / "notes").mkdir()  # a directory on node 0, a file here
    (node / "notes" / "n.txt").write_text("n\n")
    (source / "notes").write_text("notes\n")
    (source / "train.py").write_text("print('changed')\n")
    pods = _failed_sync(project, source)
    assert [(p["ok"], p["conflicts"]) for p in pods] == [(False, ["results", "notes"]), (True, [])]
    assert pods[0]["result"] == ("conflict: results, notes: a directory on one side, not on the other; "
                                 "kept as on the node, --delete replaces")
    assert (node / "results").read_text() == "made on the node\n"
    assert (node / "notes" / "n.txt").read_text() == "n\n"
    assert (node / "train.py").read_text() == "print('changed')\n"  # the rest is copied
    other = project.pod_dir(1) / "workspace"
    assert (other / "results" / "r.txt").is_file() and (other / "notes").read_text() == "notes\n"
    report = _sync(project, source, "--delete")
    assert [p["conflicts"] for p in report["pods"]] == [[], []]  # type: ignore[union-attr]
    assert (node / "results" / "r.txt").read_text() == "r\n"
    assert (node / "notes").read_text() == "notes\n"


def test_the_workspace_cannot_shadow_the_runtime(project: LocalProject) -> None:
    source = project.source({"train.py": "x\n", ".mlenvignore": "*.py\nmlenv/\n",
                             ".mlenv/mlenv/runtime/__main__.py": "raise SystemExit('shadowed')\n",
                             ".mlenv/runs/theirs/output.log": "not ours\n"})
    _sync(project, source)
    node = project.pod_dir(0) / "workspace"
    (node / "old.txt").write_text("deleted by --delete only\n")
    (node / ".mlenv" / "runs" / "job-1").mkdir(parents=True)
    (node / ".mlenv" / "runs" / "job-1" / "output.log").write_text("a running job\n")
    shipped = {"__init__.py": (PACKAGE / "__init__.py").read_bytes(),
               **{f"runtime/{name}": data for name, data in _runtime(PACKAGE / "runtime").items()}}
    for delete in ((), ("--delete",)):
        (node / ".mlenv" / "mlenv" / "runtime" / "stale.py").write_text("not shipped by this mlenv\n")
        report = _sync(project, source, *delete)
        assert report["notes"] == [".mlenv/ of the source is not copied: on the nodes it holds mlenv's runtime "
                                   "and runs"]
        assert _runtime(node / ".mlenv" / "mlenv") == shipped  # stale.py is gone, with or without --delete
        assert (node / ".mlenv" / "runs" / "job-1" / "output.log").read_text() == "a running job\n"
        assert not (node / ".mlenv" / "runs" / "theirs").exists()
        assert (node / "old.txt").exists() == (not delete)
    out = project.ok("exec", "--pod", "0", "--", "python3", "-m", "mlenv.runtime", "--help").stdout
    assert "shadowed" not in out and "usage" in out.lower()


def test_clear_the_list_in_mlenvignore_is_bad_input(project: LocalProject) -> None:
    source = project.source({"train.py": "x\n", ".mlenvignore": "*.ckpt\n!\n"})
    result = project.mlenv("sync", "--source", str(source))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"error: {source}/.mlenvignore:2: '!' (clear the list) is not supported: it would "
                             "clear mlenv's own rules too; list only what to leave out\n")
    assert not (project.pod_dir(0) / "workspace" / "train.py").exists()


def test_progress_lines_without_a_terminal(project: LocalProject) -> None:
    source = project.source({"train.py": "x\n"})
    with (source / "disk.img").open("wb") as image:
        image.truncate(100 * 2**20)
    result = project.ok("sync", "--source", str(source))
    for ordinal in (0, 1):
        assert re.search(rf"^node-{ordinal}: \d+ files, 10\d\.\d MB, ok$", result.stderr, re.MULTILINE), result.stderr


def _on_a_terminal(project: LocalProject, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run the real `mlenv` with its stderr on a pseudo-terminal: (exit code, stdout, what the terminal got)."""
    import pty

    main, side = pty.openpty()
    env = {**os.environ, "MLENV_HOME": str(project.home), "TERM": "xterm-256color", "COLUMNS": "160"}
    seen = b""
    with subprocess.Popen([str(MLENV), *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=side) as proc:
        os.close(side)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([main], [], [], 1.0)[0]:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: every end of the terminal is closed
                    break
                if not chunk:
                    break
                seen += chunk
        os.close(main)
        out = proc.stdout.read().decode() if proc.stdout else ""
        code = proc.wait(timeout=10)
    return code, out, seen.decode(errors="replace")


def test_live_progress_on_a_terminal(project: LocalProject) -> None:
    source = project.source({"train.py": "x\n"})
    with (source / "disk.img").open("wb") as image:
        image.truncate(100 * 2**20)
    code, out, terminal = _on_a_terminal(project, "sync", "--source", str(source), "--json")
    assert code == 0 and json.loads(out)["ok"]
    for ordinal in (0, 1):
        assert re.search(rf"node-{ordinal}: \d+ files, 10\d\.\d MB, ok", terminal), terminal
