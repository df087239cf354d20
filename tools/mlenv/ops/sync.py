"""Copy the workspace (and the stdlib in-pod runtime) to every pod: rsync, over the backend's remote shell
when it has one, else a tar stream over exec when the pod has no rsync; parallel, incremental, one copy when
the workspace volume is shared."""

from __future__ import annotations

import re
import shlex
import subprocess
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
    files: int = 0
    bytes: int = 0
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


def _runtime_source() -> Path:
    """tools/mlenv: its __init__.py and runtime/ are what pods need to run ``python3 -m mlenv.runtime``."""
    return Path(mlenv.__file__).resolve().parent


def _filters(source: Path) -> list[str]:
    """Exclude options shared by rsync and tar."""
    options = [f"--exclude={pattern}" for pattern in EXCLUDES]
    if (source / IGNORE_FILE).is_file():
        options.append(f"--exclude-from={source / IGNORE_FILE}")
    return options


def _count(pattern: str, text: str) -> int:
    match = re.search(pattern + r":\s*([\d,.]+)", text)
    return int(match.group(1).replace(",", "").replace(".", "")) if match else 0


def _run(argv: Sequence[str], stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, stdin=stdin, capture_output=True, text=True, check=False)


def _rsync(source: Path, target: CopyTarget, delete: bool) -> tuple[int, int, str | None]:
    """rsync the workspace, then the runtime; (files, bytes, error)."""
    rsh = ["-e", shlex.join(target.rsh)] if target.rsh else []
    destination = target.destination.rstrip("/") + "/"
    # The runtime directory is protected from --delete: it is not part of the source.
    workspace = ["rsync", "-a", "--stats", *rsh, *_filters(source), f"--exclude=/{RUNTIME_DIR}",
                 *(["--delete"] if delete else []), f"{source}/", destination]
    package = _runtime_source()
    runtime = ["rsync", "-a", "--stats", "--relative", "--delete", *rsh, *_filters(package),
               f"{package.parent}/./{package.name}/__init__.py", f"{package.parent}/./{package.name}/runtime",
               destination + RUNTIME_DIR + "/"]
    files = size = 0
    for argv in (workspace, runtime):
        result = _run(argv)
        if result.returncode != 0:
            return files, size, (result.stderr.strip().splitlines() or [f"rsync exit {result.returncode}"])[-1]
        files += _count("Number of regular files transferred", result.stdout)
        size += _count("Total transferred file size", result.stdout)
    return files, size, None


def _tar(backend: Backend, deployment: Deployment, pod: Pod, source: Path) -> tuple[int, int, str | None]:
    """Stream the workspace and the runtime as tar archives through exec (not incremental, no --delete)."""
    package = _runtime_source()
    streams = [
        (["tar", "-C", str(source), *_filters(source), "-cf", "-", "."], ["tar", "-xf", "-"]),
        (["tar", "-C", str(package.parent), *_filters(package), "-cf", "-", f"{package.name}/__init__.py",
          f"{package.name}/runtime"],
         ["sh", "-c", f'mkdir -p {RUNTIME_DIR} && exec tar -xf - -C {RUNTIME_DIR}']),
    ]
    files = 0
    for pack, unpack in streams:
        with subprocess.Popen(pack, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as producer:
            result = _run(backend.exec_argv(deployment, pod, unpack), stdin=producer.stdout.fileno()
                          if producer.stdout else None)
        if producer.returncode != 0 or result.returncode != 0:
            return files, 0, (result.stderr.strip().splitlines() or ["tar stream failed"])[-1]
        files += 1
    return sum(1 for p in source.rglob("*") if p.is_file()), 0, None


def _has_rsync(backend: Backend, deployment: Deployment, pod: Pod, target: CopyTarget) -> bool:
    """Local destinations always do; a remote pod only when rsync is on its PATH."""
    if not target.rsh:
        return True
    probe = backend.exec_argv(deployment, pod, ["sh", "-c", "command -v rsync"])
    return _run(probe).returncode == 0


def _sync_pod(backend: Backend, deployment: Deployment, pod: Pod, source: Path, delete: bool) -> PodSync:
    started = time.monotonic()
    target = backend.copy_target(deployment, pod)
    if _has_rsync(backend, deployment, pod, target):
        method = "rsync"
        files, size, error = _rsync(source, target, delete)
    else:
        method = "tar"
        files, size, error = _tar(backend, deployment, pod, source)
    return PodSync(pod.name, pod.ordinal, method, error is None, files, size,
                   round(time.monotonic() - started, 3), error)


def sync(backend: Backend, deployment: Deployment, source: Path | None = None, delete: bool = False,
         as_json: bool = False) -> SyncReport:
    """Sync ``source`` (default: the project's workspace/) to every pod and print a summary."""
    from mlenv.config.discover import project_root

    source = (source or project_root() / "workspace").resolve()
    if not source.is_dir():
        raise UsageError(f"nothing to sync: {source} is not a directory (use --source DIR)")
    pods = backend.pods(deployment)
    shared = deployment.storage.shared
    targets = pods[:1] if shared else pods
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        rows = list(pool.map(lambda pod: _sync_pod(backend, deployment, pod, source, delete), targets))
    if shared:
        rows += [PodSync(p.name, p.ordinal, f"shared with {pods[0].name}", rows[0].ok) for p in pods[1:]]
    report = SyncReport(str(source), shared, rows)
    _print(report, as_json)
    return report


def _print(report: SyncReport, as_json: bool) -> None:
    from mlenv.ui import error, print_json, table

    if as_json:
        print_json({"ok": report.ok, "source": report.source, "shared": report.shared,
                    "pods": [asdict(row) for row in report.pods]})
        return
    table(f"sync {report.source}" + (" (shared workspace: copied once)" if report.shared else ""),
          ["POD", "METHOD", "FILES", "BYTES", "SECONDS", "RESULT"],
          [[r.pod, r.method, r.files, r.bytes, r.seconds, "ok" if r.ok else f"FAILED: {r.error}"]
           for r in report.pods])
    for row in report.pods:
        if not row.ok:
            error(f"sync to {row.pod} failed: {row.error}")
