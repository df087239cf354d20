"""The local backend: `mlenv launch` of a 2x2 torchrun job against the same job started by hand with two
torchrun commands (median of 3), and an incremental `mlenv sync` to 8 pods after touching one file of a
5,000-file workspace against one plain `rsync -a` of the same tree to one directory (median of 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.bench.timing import median_time, row
from tests.integration.local_cluster import TINY_JOB, LocalProject, make_project

REPEAT = 3
FILES = 5000
SYNC_PODS = 8
HAND_PORT = 29611


def _by_hand(source: Path, netns: str | None) -> Callable[[], object]:
    """Two torchrun commands, one per "node", on the loopback of one pod (same network, no mlenv), with the
    c10d rendezvous that the runtime uses (torchrun's static rendezvous spends seconds more on every exit)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []

    def run() -> object:
        nodes = [subprocess.Popen(
            [*prefix, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{HAND_PORT}", "--rdzv-id", "by-hand",
             "--local-addr", "127.0.0.1", "--rdzv-conf", f"is_host={str(rank == 0).lower()}", "tiny.py"],
            cwd=source, env={**os.environ, "MLENV_NODE_RANK": str(rank), "GLOO_SOCKET_IFNAME": "lo"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for rank in (0, 1)]
        codes = [node.wait() for node in nodes]
        if any(codes):
            raise RuntimeError(f"torchrun by hand failed: {codes}")
        return codes

    return run


def _mlenv(project: LocalProject, *args: str) -> Callable[[], object]:
    return lambda: project.ok(*args, timeout=300)


def _launch_rows(home: Path) -> list[dict[str, object]]:
    isolation = "namespaces" if os.geteuid() == 0 else "processes"
    project = make_project(home, "blaunch", "10.77.71.0/24", isolation)
    source = project.source({"tiny.py": TINY_JOB})
    project.ok("deploy", project.name)
    try:
        project.ok("sync", "--source", str(source))
        netns = str(project.status()[0]["host"]) if isolation == "namespaces" else None  # its network namespace
        by_hand = median_time(_by_hand(source, netns), REPEAT)
        launch = median_time(_mlenv(project, "launch", "--launcher", "torchrun", "tiny.py"), REPEAT)
    finally:
        project.mlenv("clean", "--delete-data", "--yes")
    return [row("torchrun 2x2 by hand (2 commands)", by_hand, by_hand, "torchrun by hand"),
            row("mlenv launch torchrun 2x2", launch, by_hand, "torchrun by hand")]


def _touching(path: Path, action: Callable[[], object]) -> Callable[[], object]:
    """``action`` after a change to ``path``, so each timed sync has exactly one file to copy."""

    def run() -> object:
        path.write_text(path.read_text() + "#\n")
        return action()

    return run


def _sync_rows(home: Path) -> list[dict[str, object]]:
    project = make_project(home, "bsync", "10.77.72.0/24", "processes")
    source = project.source({f"pkg{i // 100:02d}/mod{i % 100:02d}.py": f"x = {i}\n" for i in range(FILES)})
    touched = source / "pkg00" / "mod00.py"
    copy = home / "plain-copy"
    plain = ["rsync", "-a", f"{source}/", f"{copy}/"]
    project.ok("deploy", project.name, "--nodes", str(SYNC_PODS))
    try:
        reference = median_time(_touching(touched, lambda: subprocess.run(plain, check=True)), REPEAT)
        synced = median_time(_touching(touched, _mlenv(project, "sync", "--source", str(source))), REPEAT)
    finally:
        project.mlenv("clean", "--delete-data", "--yes")
    return [row(f"rsync -a {FILES} files, 1 touched, 1 dir", reference, reference, "one plain rsync -a"),
            row(f"mlenv sync {FILES} files, 1 touched, {SYNC_PODS} pods", synced, reference, "one plain rsync -a")]


def run() -> list[dict[str, object]]:
    """Aim: launch overhead <= 1.3x of starting torchrun by hand; sync to 8 pods <= 3x of one rsync."""
    with tempfile.TemporaryDirectory(prefix="mlenv-bench-") as launch_home, \
            tempfile.TemporaryDirectory(prefix="mlenv-bench-") as sync_home:
        return _launch_rows(Path(launch_home)) + _sync_rows(Path(sync_home))
