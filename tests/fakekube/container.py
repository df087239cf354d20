"""One run of a pod's container: started in its own namespaces with its command as PID 1, its output kept as the
container log (what ``kubectl logs`` serves), its exit recorded, and ``kubectl exec`` sessions entering it.

The process tree: ``[ip netns exec NETNS] unshare --mount --pid --fork --uts -- python3 sandbox.py SPEC``;
unshare forks the sandbox, which sets the root up and execs the container's command: that pid is the
container's PID 1 (``pid1``). When it ends, the kernel kills everything else in its PID namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .security import Security
from .store import now_iso

SANDBOX = Path(__file__).with_name("sandbox.py")
START_SECONDS = 10.0
"""How long the sandbox may take to fork the container's PID 1."""


@dataclass(frozen=True)
class Terminated:
    """How a container run ended (``lastState.terminated`` / ``state.terminated``)."""

    exit_code: int
    started_at: str
    finished_at: str
    container_id: str

    @property
    def reason(self) -> str:
        """``Completed`` for exit 0, else ``Error`` (like CRI-O and containerd)."""
        return "Completed" if self.exit_code == 0 else "Error"

    def document(self) -> dict[str, object]:
        """As the Kubernetes API shows it."""
        return {"terminated": {"exitCode": self.exit_code, "reason": self.reason, "startedAt": self.started_at,
                               "finishedAt": self.finished_at, "containerID": self.container_id}}


@dataclass(frozen=True)
class Sandbox:
    """What the container is made of: its root, mounts (source directory or file, container path, read-only), hostname,
    working directory, command and environment, the network namespace (None: this machine's network), the
    security context it runs with, and the kubelet's own directory (hidden from it, as a node's /var/lib/kubelet
    is from a real container: no pod reads another's volumes, or another container's token, there)."""

    root: Path
    mounts: Sequence[tuple[str, str, bool]]
    hostname: str
    workdir: str
    argv: Sequence[str]
    env: Mapping[str, str]
    netns: str | None
    user_namespace: bool
    security: Security
    kubelet_dir: str


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Container:
    """A running (or ended) container; ``ended`` is set once it exited and its output is all in ``log``."""

    sandbox: Sandbox
    log: Path
    process: subprocess.Popen[bytes]
    pid1: int
    started_at: str = field(default_factory=now_iso)
    container_id: str = field(default_factory=lambda: f"cri-o://{uuid.uuid4().hex}")
    ended: threading.Event = field(default_factory=threading.Event)
    terminated: Terminated | None = None

    @classmethod
    def start(cls, sandbox: Sandbox, log: Path, spec_path: Path) -> Container:
        """Start the sandbox; its output (stdout and stderr, as the container runtime keeps them) goes to ``log``.
        OSError when PID 1 does not appear."""
        argv = ["unshare", *(["--user", "--map-root-user"] if sandbox.user_namespace else []), "--pid", "--fork",
                *_sandbox_argv(sandbox, spec_path)]
        if sandbox.netns:
            argv = ["ip", "netns", "exec", sandbox.netns, *argv]
        read_end, write_end = os.pipe()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                                       start_new_session=True)
        finally:
            os.close(write_end)
        copier = threading.Thread(target=_copy, args=(read_end, log), name=f"log-{sandbox.hostname}", daemon=True)
        copier.start()  # before PID 1 is found: a sandbox that fails says why in the log
        pid1 = _child(process)
        _until_executed(pid1, process)
        container = cls(sandbox, log, process, pid1)
        threading.Thread(target=container._wait, args=(copier,), name=f"wait-{sandbox.hostname}", daemon=True).start()
        return container

    def _wait(self, copier: threading.Thread) -> None:
        """Once the output is all in the log (the last writer is gone), record the exit."""
        copier.join()
        code = exit_status(self.process.wait())
        self.terminated = Terminated(code, self.started_at, now_iso(), self.container_id)
        self.ended.set()

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to PID 1 (a PID 1 without a handler for it ignores it, except SIGKILL)."""
        if not self.ended.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid1, signum)

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once it ended."""
        self.signal(signal.SIGTERM)
        if not self.ended.wait(max(grace, 0.0)):
            self.signal(signal.SIGKILL)
            self.ended.wait()

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside this container: in its PID and network namespaces, with the
        same root, mounts, working directory and environment (the mount namespace is made again rather than
        entered: not every kernel, gVisor for one, lets ``setns`` enter a mount namespace)."""
        enter = ["nsenter", f"--target={self.pid1}", *(["--user"] if self.sandbox.user_namespace else []), "--net",
                 "--pid", "--"]
        spec_path = self.log.parent / f"exec-{uuid.uuid4().hex}.json"
        return [*enter, *_sandbox_argv(replace(self.sandbox, argv=tuple(argv)), spec_path, remove=True)]


def _sandbox_argv(sandbox: Sandbox, spec_path: Path, remove: bool = False) -> list[str]:
    """``unshare --mount --uts -- python3 sandbox.py SPEC`` after writing SPEC (``remove``: the sandbox deletes
    it once read)."""
    spec = {"root": str(sandbox.root), "mounts": [list(m) for m in sandbox.mounts], "hostname": sandbox.hostname,
            "workdir": sandbox.workdir, "argv": list(sandbox.argv), "env": dict(sandbox.env), "remove": remove,
            "security": sandbox.security.document(), "hidden": sandbox.kubelet_dir}
    spec_path.write_text(json.dumps(spec))
    return ["unshare", "--mount", "--uts", "--", sys.executable, "-I", str(SANDBOX), str(spec_path)]


def _copy(read_end: int, log: Path) -> None:
    """Copy the container's output into its log until the last writer is gone."""
    with open(read_end, "rb", buffering=0) as pipe, log.open("ab", buffering=0) as out:
        while chunk := pipe.read(65536):
            out.write(chunk)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _is_namespace_init(pid: int) -> bool:
    """Whether ``pid`` is PID 1 of a PID namespace below ours (its NSpid line ends in 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    return len(ids) > 1 and ids[-1] == "1"


def _until_executed(pid1: int, process: subprocess.Popen[bytes]) -> None:
    """Wait until the sandbox became the container's command (a signal sent before would find no handler of the
    command's, and PID 1 ignores those), or ended."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if str(SANDBOX).encode() not in Path(f"/proc/{pid1}/cmdline").read_bytes():
                return
        except OSError:
            return
        time.sleep(0.005)


def _child(process: subprocess.Popen[bytes]) -> int:
    """The container's PID 1 (below ``ip netns exec``, which may fork, and unshare), as soon as it exists;
    OSError when the sandbox ended first."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        pending = [process.pid]
        while pending:
            pid = pending.pop()
            if _is_namespace_init(pid):
                return pid
            pending += _children(pid)
        if process.poll() is not None:
            break
        time.sleep(0.005)
    raise OSError(f"the container's sandbox ended before its command started (exit {process.poll()})")
