"""``python -m mlenv.runtime.rank SCRIPT ARGS...``: one rank of the job, as torchrun or DeepSpeed starts it.

Runs the user's script as its child and tells the node supervisor (``MLENV_SUPERVISOR_SOCKET``, a unix socket)
who the rank is (``RANK``/``LOCAL_RANK`` from this worker's own environment), the child's pid and how it ended.
The child's stdout and stderr are a connection of their own to the supervisor, so its lines never meet another
rank's. The child leads its own process group: every signal this wrapper receives is passed on once to that group,
and the child is killed when the wrapper dies. A signal this wrapper finds ignored stays ignored, here and in the
child, and is not passed on: whoever ignored it sends it to every process of the job, the user's included (Slurm's
warning signal, which the ranks catch themselves); passed on as well, it would reach the child twice, the second time
after its handler's exit had begun, and kill it. We exit as the child did (by its signal, if it was killed).
Without a supervisor the script simply runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .forensics import collectives
from .forensics.stacks import FAULTHANDLER_DIR, FAULTHANDLER_FILE, faulthandler_file

SOCKET_VARIABLE = "MLENV_SUPERVISOR_SOCKET"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def identity(environ: Mapping[str, str]) -> dict[str, int]:
    """This rank's global and local rank, from the launcher's variables (DeepSpeed and torchrun set both)."""
    return {"rank": int(environ.get("RANK", "0")), "local_rank": int(environ.get("LOCAL_RANK", "0"))}


def _connect(path: str, header: Mapping[str, object]) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    connection.sendall(json.dumps(header).encode() + b"\n")
    return connection


def _die_with_parent() -> None:
    """In the child before exec: its own process group, and SIGKILL when the wrapper dies (Linux)."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run ``argv`` (script and arguments) under the supervisor; the exit status to leave with (negative: the
    signal that killed the child)."""
    command = [sys.executable, *_script_first(argv)]
    path = environ.get(SOCKET_VARIABLE)
    who = identity(environ)
    try:
        if not path:
            raise FileNotFoundError(SOCKET_VARIABLE)
        control = _connect(path, {"kind": "control", **who})
        output = _connect(path, {"kind": "output", **who})
    except OSError:  # no supervisor (any more): the script runs all the same
        return subprocess.call(command)
    forwarded: set[int] = set()
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if signum in forwarded or child is None:
            return  # delivered once: a signal sent both to our group and to us is still one signal
        forwarded.add(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, forward)
    child = subprocess.Popen(command, stdout=output.fileno(), stderr=output.fileno(), env=child_environ(environ),
                             preexec_fn=_die_with_parent)  # only os and prctl: safe with threads
    output.close()  # the child holds it; the supervisor sees its end when the child's last holder closes it
    _send(control, {"event": "started", "pid": child.pid})
    status = child.wait()
    code, killed_by = (128 - status, signal_name(-status)) if status < 0 else (status, None)
    _send(control, {"event": "exited", "exit_code": code, "signal": killed_by})
    control.close()
    return status


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The user's process's environment: ours, plus its own faulthandler file and collective record when the
    launcher armed the job (the runtime's sitecustomize arms them there, in that process only)."""
    child = dict(environ)
    rank = identity(environ)["rank"]
    if environ.get(FAULTHANDLER_DIR):
        child[FAULTHANDLER_FILE] = str(faulthandler_file(Path(environ[FAULTHANDLER_DIR]), rank))
    if environ.get(collectives.DIRECTORY_ENV):
        child[collectives.FILE_ENV] = str(collectives.record_file(Path(environ[collectives.DIRECTORY_ENV]), rank))
    return child


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``SIG34`` for a signal without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def _script_first(argv: Sequence[str]) -> list[str]:
    """DeepSpeed's ``--module`` puts ``--local_rank=N`` before the script: it belongs after it."""
    if len(argv) > 1 and argv[0].startswith("--local_rank="):
        return [argv[1], argv[0], *argv[2:]]
    return list(argv)


def _send(connection: socket.socket, message: Mapping[str, object]) -> None:
    with contextlib.suppress(OSError):  # the supervisor is gone: the job goes on as it would without one
        connection.sendall(json.dumps(message).encode() + b"\n")


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m mlenv.runtime.rank SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    status = run(sys.argv[1:], os.environ)
    if status < 0:  # leave as the child did: killed by the same signal
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
