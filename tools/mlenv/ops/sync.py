"""Copy the workspace (and the stdlib in-pod runtime) to every pod: rsync, over the backend's remote shell
when it has one, else a tar stream over exec when the pod has no rsync; parallel, incremental, one copy when
the workspace volume is shared."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import mlenv
from mlenv.backends.base import Backend, CopyTarget, Pod
from mlenv.errors import UsageError
from mlenv.plan import Deployment

MAX_PARALLEL = 8
EXCLUDES = (".git", "__pycache__", "*.pyc", ".DS_Store")
IGNORE_FILE = ".mlenvignore"
RUNTIME_DIR = ".mlenv"
"""Where the in-pod runtime lands inside the workspace (put on PYTHONPATH by the backends)."""


@dataclass(frozen=True)
class PodSync:
    """What the sync did for one pod."""

    pod: str
    ordinal: int
    method: str
    ok: bool
    files: int | None = None
    bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class SyncReport:
    """One row per pod; ``ok`` only when every pod got the workspace."""

    source: str
    shared: bool
    pods: list[PodSync]

    @property
    def ok(self) -> bool:
        """True when no pod failed."""
        return all(p.ok for p in self.pods)


def _stage_runtime(stage: Path) -> None:
    """Copy the in-pod runtime (mlenv/__init__.py and mlenv/runtime/, stdlib only) to ``stage``/.mlenv/mlenv,
    keeping file times so that rsync leaves unchanged files alone in the pods."""
    package = Path(mlenv.__file__).resolve().parent
    target = stage / RUNTIME_DIR / package.name
    target.mkdir(parents=True)
    shutil.copy2(package / "__init__.py", target / "__init__.py")
    shutil.copytree(package / "runtime", target / "runtime", ignore=shutil.ignore_patterns(*EXCLUDES))


def _patterns(source: Path) -> list[str]:
    """The built-in excludes plus the patterns of ``source``/.mlenvignore (rsync syntax, # comments)."""
    ignore = source / IGNORE_FILE
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    return [*EXCLUDES, *(line.strip() for line in lines if line.strip() and not line.startswith(("#", ";")))]


def _filters(source: Path, for_tar: bool = False) -> list[str]:
    """Exclude options; tar has no anchors or directory-only patterns, so those become plain names."""
    return [f"--exclude={p.strip('/') if for_tar else p}" for p in _patterns(source)]


def _count(pattern: str, text: str) -> int:
    match = re.search(pattern + r":\s*([\d,.]+)", text)
    return int(match.group(1).replace(",", "").replace(".", "")) if match else 0


def _run(argv: Sequence[str], stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, stdin=stdin, capture_output=True, text=True, check=False)


def _rsync(source: Path, stage: Path, target: CopyTarget, delete: bool) -> tuple[int, int, str | None]:
    """One rsync per pod: the workspace at the top, the staged runtime under .mlenv/ (``/./`` marks where
    the relative paths start); (files, bytes, error)."""
    rsh = ["-e", shlex.join(target.rsh)] if target.rsh else []
    argv = ["rsync", "-a", "--relative", "--stats", *rsh, *_filters(source), *(["--delete"] if delete else []),
            f"{source}/./", f"{stage}/./{RUNTIME_DIR}", target.destination.rstrip("/") + "/"]
    result = _run(argv)
    if result.returncode != 0:
        return 0, 0, (result.stderr.strip().splitlines() or [f"rsync exit {result.returncode}"])[-1]
    return (_count("Number of regular files transferred", result.stdout),
            _count("Total transferred file size", result.stdout), None)


def _tar(backend: Backend, deployment: Deployment, pod: Pod, source: Path, stage: Path) -> str | None:
    """Stream the workspace and the staged runtime as one tar archive through exec (not incremental, no
    --delete); the error, if any."""
    pack = ["tar", *_filters(source, for_tar=True), "-cf", "-", "-C", str(source), ".", "-C", str(stage),
            RUNTIME_DIR]
    with subprocess.Popen(pack, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as producer:
        result = _run(backend.exec_argv(deployment, pod, ["tar", "-xf", "-"]),
                      stdin=producer.stdout.fileno() if producer.stdout else None)
    if producer.returncode != 0 or result.returncode != 0:
        return (result.stderr.strip().splitlines() or ["tar stream failed"])[-1]
    return None


def _has_rsync(backend: Backend, deployment: Deployment, pod: Pod, target: CopyTarget) -> bool:
    """Local destinations always do; a remote pod only when rsync is on its PATH."""
    if not target.rsh:
        return True
    probe = backend.exec_argv(deployment, pod, ["sh", "-c", "command -v rsync"])
    return _run(probe).returncode == 0


def _sync_pod(backend: Backend, deployment: Deployment, pod: Pod, source: Path, stage: Path,
              delete: bool) -> PodSync:
    started = time.monotonic()
    target = backend.copy_target(deployment, pod)
    if not _has_rsync(backend, deployment, pod, target):
        error = _tar(backend, deployment, pod, source, stage)
        method = "tar (no rsync in the pod: copies all, cannot --delete)" if delete else "tar"
        return PodSync(pod.name, pod.ordinal, method, error is None, seconds=_since(started), error=error)
    files, size, error = _rsync(source, stage, target, delete)
    return PodSync(pod.name, pod.ordinal, "rsync", error is None, files, size, _since(started), error)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def sync(backend: Backend, deployment: Deployment, source: Path | None = None, delete: bool = False,
         as_json: bool = False) -> SyncReport:
    """Sync ``source`` (default: the project's workspace/) to every pod and print a summary."""
    from mlenv.config.discover import project_root
    from mlenv.ui import spinner

    source = (source or project_root() / "workspace").resolve()
    if not source.is_dir():
        raise UsageError(f"nothing to sync: {source} is not a directory (use --source DIR)")
    pods = backend.pods(deployment)
    shared = deployment.storage.shared
    targets = pods[:1] if shared else pods
    copies = "once (shared workspace)" if shared else f"to {len(targets)} pods"
    with tempfile.TemporaryDirectory(prefix="mlenv-sync-") as staging, \
            spinner(f"syncing {source} {copies}, {min(MAX_PARALLEL, len(targets))} at a time"), \
            ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        stage = Path(staging)
        _stage_runtime(stage)
        rows = list(pool.map(lambda pod: _sync_pod(backend, deployment, pod, source, stage, delete), targets))
    if shared:
        rows += [PodSync(p.name, p.ordinal, f"shared with {pods[0].name}", rows[0].ok) for p in pods[1:]]
    report = SyncReport(str(source), shared, rows)
    _print(report, as_json)
    return report


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print(report: SyncReport, as_json: bool) -> None:
    from mlenv.ui import error, print_json, table

    if as_json:
        print_json({"ok": report.ok, "source": report.source, "shared": report.shared,
                    "pods": [asdict(row) for row in report.pods]})
        return
    table(f"sync {report.source}" + (" (shared workspace: copied once)" if report.shared else ""),
          ["POD", "METHOD", "FILES", "BYTES", "SECONDS", "RESULT"],
          [[r.pod, r.method, _cell(r.files), _cell(r.bytes), r.seconds, "ok" if r.ok else f"FAILED: {r.error}"]
           for r in report.pods])
    for row in report.pods:
        if not row.ok:
            error(f"sync to {row.pod} failed: {row.error}")
