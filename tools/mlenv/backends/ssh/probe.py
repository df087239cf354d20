"""Run on each host by the ssh backend as ``PYTHON -c <this file's text> REQUEST``: stdlib only, Python 3.7+ (so
that a host with an older Python than the runtime needs still says which one it has).

REQUEST is a JsonValue object naming what to do; the steps run in this order: ``make`` (create the workspace, marking
it as mlenv's with ``owner`` when this call created it), ``marker_write`` / ``marker_look`` / ``marker_remove``
(the shared-filesystem test: a file written through host 0, looked for through the others), ``gpus``
(``nvidia-smi -L``), ``jobs`` / ``stop`` (the shipped runtime's ``jobs --json`` / ``stop`` in the workspace),
``delete`` (the workspace, only when it carries ``owner``'s mark), ``free_port``, ``ports`` (which of them are
``taken``), ``listen`` / ``connect`` (doctor's rendezvous test). The answer is one JSON object on a line starting
with ``mlenv-probe:`` (``listen`` first answers with its port); a login shell's startup files may print lines before
it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TypedDict is Python 3.8+ and the probe runs on 3.7: these types exist for mypy only
    from typing import TypedDict

    from mlenv.runtime.records.jsonvalue import JsonObject

    class ProbeListen(TypedDict):
        """``listen``: how long to wait for how many connections."""

        timeout: float
        count: int

    class ProbeConnect(TypedDict):
        """``connect``: where to connect, and how long to try."""

        address: str
        port: int
        timeout: float

    class ProbeRequest(TypedDict, total=False):
        """What the probe is asked to do (the module's docstring)."""

        workdir: str
        owner: str
        make: bool
        marker_write: str | None
        marker_look: str
        marker_remove: str
        gpus: bool
        jobs: bool
        stop: bool
        delete: bool
        free_port: bool
        ports: list[int]
        listen: ProbeListen
        connect: ProbeConnect

    class ProbeAnswer(TypedDict, total=False):
        """The probe's answer: the host's basics, then what each step found."""

        hostname: str
        python: list[int]
        address: str | None
        rsync: bool
        workspace: str
        exists: bool
        writable: bool
        free_bytes: int
        created: bool
        error: str
        marker_seen: bool
        gpu_error: str
        gpus: int
        jobs: list[JsonObject]
        jobs_error: str
        stopped: list[str]
        deleted: bool
        kept: str
        free_port: int
        taken: list[int]
        port: int
        accepted: int
        connected: bool
        connect_error: str

PREFIX = "mlenv-probe: "
RUNTIME_DIR = ".mlenv"
OWNER_FILE = os.path.join(RUNTIME_DIR, "owner")
COMMAND_TIMEOUT = 60


def answer(data: ProbeAnswer) -> None:
    print(PREFIX + json.dumps(data), flush=True)


def existing_ancestor(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def basics(workspace: str) -> ProbeAnswer:
    """Who and where this host is, and what it has."""
    connection = os.environ.get("SSH_CONNECTION", "").split()
    ancestor = existing_ancestor(workspace)
    disk = os.statvfs(ancestor)
    return {
        "hostname": socket.gethostname(),
        "python": list(sys.version_info[:3]),
        "address": connection[2] if len(connection) > 2 else None,
        "rsync": shutil.which("rsync") is not None,
        "workspace": workspace,
        "exists": os.path.isdir(workspace),
        "writable": os.access(ancestor, os.W_OK),
        "free_bytes": disk.f_bavail * disk.f_frsize,
    }


def make(workspace: str, owner: str, out: ProbeAnswer) -> None:
    created = not os.path.isdir(workspace)
    try:
        os.makedirs(os.path.join(workspace, RUNTIME_DIR), exist_ok=True)
        if created:
            with open(os.path.join(workspace, OWNER_FILE), "w") as handle:
                handle.write(owner + "\n")
    except OSError as exc:
        out["error"] = f"cannot create the workspace {workspace}: {exc.strerror}"
        return
    out["created"], out["exists"], out["workspace"] = created, True, os.path.realpath(workspace)


def marker(workspace: str, request: ProbeRequest, out: ProbeAnswer) -> None:
    steps = (("marker_write", request.get("marker_write")), ("marker_look", request.get("marker_look")),
             ("marker_remove", request.get("marker_remove")))
    for step, token in steps:
        if not token:
            continue
        path = os.path.join(workspace, RUNTIME_DIR, f"shared-{token}")
        try:
            if step == "marker_write":
                with open(path, "w") as handle:
                    handle.write(socket.gethostname() + "\n")
            elif step == "marker_look":
                out["marker_seen"] = os.path.exists(path)
            elif os.path.exists(path):
                os.unlink(path)
        except OSError as exc:
            out["error"] = f"cannot write in the workspace {workspace}: {exc.strerror}"


def gpus(out: ProbeAnswer) -> None:
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                                check=False)
    except FileNotFoundError:
        out["gpu_error"] = "nvidia-smi not found (no NVIDIA driver?)"
        return
    except subprocess.TimeoutExpired:
        out["gpu_error"] = f"nvidia-smi -L did not answer in {COMMAND_TIMEOUT} s"
        return
    if result.returncode != 0:
        out["gpu_error"] = (result.stderr.strip() or result.stdout.strip() or "nvidia-smi -L failed").splitlines()[-1]
        return
    out["gpus"] = sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))


def runtime(workspace: str, *args: str) -> subprocess.CompletedProcess[str] | None:
    """The shipped runtime's command in the workspace; None when sync has not shipped it yet."""
    shipped = os.path.join(workspace, RUNTIME_DIR)
    if not os.path.isdir(os.path.join(shipped, "mlenv", "runtime")):
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [shipped, os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "mlenv.runtime", *args], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)


def jobs(workspace: str, out: ProbeAnswer) -> None:
    result = runtime(workspace, "jobs", "--json") if os.path.isdir(workspace) else None
    if result is None:
        return
    try:
        out["jobs"] = json.loads(result.stdout)
    except ValueError:
        out["jobs_error"] = (result.stderr.strip() or "runtime jobs failed").splitlines()[-1]


def stop(workspace: str, out: ProbeAnswer) -> None:
    result = runtime(workspace, "stop") if os.path.isdir(workspace) else None
    if result is not None:
        out["stopped"] = [line for line in result.stdout.splitlines() if line.startswith("stopped")]
        if result.returncode != 0:
            out["error"] = (result.stderr.strip() or result.stdout.strip() or "runtime stop failed").splitlines()[-1]


def delete(workspace: str, owner: str, out: ProbeAnswer) -> None:
    if not os.path.isdir(workspace):
        out["deleted"] = False
        return
    if read(os.path.join(workspace, OWNER_FILE)) != owner:
        out["deleted"], out["kept"] = False, "it was not made by this deployment"
        return
    shutil.rmtree(workspace, ignore_errors=True)
    out["deleted"] = not os.path.exists(workspace)


def family(address: str | None) -> socket.AddressFamily:
    return socket.AF_INET6 if address and ":" in address else socket.AF_INET


def listen(request: ProbeRequest, out: ProbeAnswer) -> None:
    """Listen on every address at a free port, say which, and count who connects before the timeout."""
    settings = request["listen"]
    with socket.socket(family(out.get("address"))) as server:
        server.bind(("", 0))
        server.listen(64)
        server.settimeout(settings["timeout"])
        answer({"port": server.getsockname()[1]})
        accepted = 0
        try:
            while accepted < settings["count"]:
                connection, _ = server.accept()
                connection.close()
                accepted += 1
        except OSError:
            pass
    out["accepted"] = accepted


def connect(request: ProbeRequest, out: ProbeAnswer) -> None:
    target = request["connect"]
    try:
        with socket.create_connection((target["address"], target["port"]), timeout=target["timeout"]):
            out["connected"] = True
    except OSError as exc:
        out["connected"], out["connect_error"] = False, str(exc)


def main(request: ProbeRequest) -> None:
    workspace = os.path.abspath(os.path.expanduser(request["workdir"]))
    out = basics(workspace)
    if request.get("make"):
        make(workspace, request["owner"], out)
    if out["exists"]:
        marker(workspace, request, out)
    if request.get("gpus"):
        gpus(out)
    if request.get("jobs"):
        jobs(workspace, out)
    if request.get("stop"):
        stop(workspace, out)
    if request.get("delete"):
        delete(workspace, request["owner"], out)
    if request.get("free_port"):
        out["free_port"] = free_port_pair(family(out["address"]))
    if request.get("ports"):
        out["taken"] = [port for port in request["ports"] if not port_free(family(out["address"]), port)]
    if request.get("listen"):
        listen(request, out)
    if request.get("connect"):
        connect(request, out)
    answer(out)


def port_free(address_family: socket.AddressFamily, port: int) -> bool:
    """Whether ``port`` can be bound on every address of this host (so on any one of them, as a listener binds it)."""
    with socket.socket(address_family) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def free_port_pair(address_family: socket.AddressFamily, tries: int = 50) -> int:
    """A free port whose next one is free too: the rendezvous, and the supervisors' control channel after it."""
    port = 0
    for _ in range(tries):
        with socket.socket(address_family) as first:
            first.bind(("", 0))
            port = first.getsockname()[1]
            if port_free(address_family, port + 1):
                return int(port)
    return int(port)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
