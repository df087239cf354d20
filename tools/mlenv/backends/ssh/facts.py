"""Run the probe (``probe.py``) on hosts over ssh, in parallel, and read its answers; a host that cannot be
reached gets a message naming it (``diagnose``) instead."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mlenv.backends.ssh.diagnose import ADDED, failure, first_contact
from mlenv.backends.ssh.probe import PREFIX
from mlenv.backends.sshlink.hosts import HostSpec
from mlenv.backends.sshlink.transport import SSH_FAILED, Transport
from mlenv.errors import shown

if TYPE_CHECKING:
    from mlenv.backends.ssh.probe import ProbeAnswer, ProbeRequest

MAX_PARALLEL = 16
COMMAND_SECONDS = 120
"""How long a probe may run once connected (nvidia-smi and the runtime's jobs/stop have 60 s each)."""
NOT_FOUND = 127
T = TypeVar("T")
R = TypeVar("R")


@cache
def probe_source() -> str:
    """The probe's text, sent to the hosts with ``python -c``."""
    return Path(__file__).with_name("probe.py").read_text()


@dataclass(frozen=True)
class Reply:
    """A host's answer to the probe, or why there is none."""

    facts: ProbeAnswer | None
    error: str | None = None
    note: str | None = None
    """What first contact recorded (the host key's fingerprint)."""
    fix: str | None = None
    """The command that fixes what ``error`` says, where there is one."""


def probe_argv(transport: Transport, host: HostSpec, python: str, request: ProbeRequest) -> list[str]:
    """The ssh command line that runs the probe with ``request`` on ``host``."""
    return transport.ssh_argv(host, [python, "-c", probe_source(), json.dumps(request)])


def answers(stdout: str) -> list[ProbeAnswer]:
    """The probe's answers in its output (startup files of the login shell may print other lines)."""
    found: list[ProbeAnswer] = []
    for line in stdout.splitlines():
        if line.startswith(PREFIX):
            try:
                found.append(json.loads(line[len(PREFIX):]))
            except ValueError:
                continue
    return found


def _reply(transport: Transport, host: HostSpec, python: str, returncode: int, stdout: str, stderr: str) -> Reply:
    """Read one finished probe."""
    label = host.display(transport.user)
    if returncode == SSH_FAILED:
        failed = failure(transport, host, stderr)
        return Reply(None, failed.message, fix=failed.fix)
    found = answers(stdout)
    note = first_contact(transport, host, stderr)
    if found:
        return Reply(found[-1], note=note)
    lines = [shown(line) for line in stderr.splitlines() if line.strip() and ADDED not in line]
    if returncode == NOT_FOUND:
        return Reply(None, f"{label}: {shown(python)} not found there (ssh.python): install Python 3 or set "
                           "ssh.python to its path", note)
    return Reply(None, f"{label}: the probe failed with exit {returncode}: {lines[-1] if lines else 'no message'}",
                 note)


def probe(transport: Transport, host: HostSpec, python: str, request: ProbeRequest) -> Reply:
    """Run the probe on one host (bounded: ConnectTimeout plus COMMAND_SECONDS)."""
    seconds = transport.connect_timeout + COMMAND_SECONDS
    try:
        result = subprocess.run(probe_argv(transport, host, python, request), capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        return Reply(None, f"{host.display(transport.user)}: no answer from the probe in {seconds} s")
    except OSError as exc:
        return Reply(None, f"{host.display(transport.user)}: cannot run ssh: {exc.strerror}")
    return _reply(transport, host, python, result.returncode, result.stdout, result.stderr)


def parallel(function: Callable[[T], R], items: Mapping[int, T]) -> dict[int, R]:
    """``function`` of every item at once (at most MAX_PARALLEL at a time), by ordinal."""
    if not items:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        futures = {ordinal: pool.submit(function, item) for ordinal, item in items.items()}
        return {ordinal: future.result() for ordinal, future in futures.items()}


def probe_all(transport: Transport, python: str, requests: Mapping[int, tuple[HostSpec, ProbeRequest]]
              ) -> dict[int, Reply]:
    """The probe on every host of ``requests`` (ordinal -> host and request) at once."""
    return parallel(lambda item: probe(transport, item[0], python, item[1]), requests)
