"""The ``slurm:`` section of a cluster file (schema: ``mlenv/backends/slurm.schema.json``), parsed for the Slurm
backend. Imported at validate time for files with ``backend: slurm``, so it imports nothing heavy."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from mlenv.errors import show_value
from mlenv.runtime.records.jsonvalue import JsonObject

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

OWNED_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "--nodes": (("-N",), "gpus.default_nodes (or mlenv --nodes)"),
    "--ntasks": (("-n",), "gpus.procs_per_node (mlenv runs one task per node, which starts the processes)"),
    "--ntasks-per-node": ((), "gpus.procs_per_node (mlenv runs one task per node, which starts the processes)"),
    "--output": (("-o",), "nothing: mlenv writes the output to slurm.workdir/.mlenv/runs/<run>/"),
    "--error": (("-e",), "nothing: mlenv writes the output to slurm.workdir/.mlenv/runs/<run>/"),
    "--open-mode": ((), "nothing: every attempt of a run appends to its output file"),
    "--job-name": (("-J",), "cluster.name (jobs are named mlenv-<name>)"),
    "--chdir": (("-D",), "slurm.workdir"),
    "--partition": (("-p",), "slurm.partition"),
    "--account": (("-A",), "slurm.account"),
    "--qos": (("-q",), "slurm.qos"),
    "--reservation": ((), "slurm.reservation"),
    "--constraint": (("-C",), "slurm.constraint"),
    "--time": (("-t",), "slurm.time"),
    "--nodelist": (("-w",), "slurm.nodelist"),
    "--cpus-per-task": (("-c",), "slurm.cpus_per_task"),
    "--mem": ((), "slurm.mem"),
    "--gpus-per-node": ((), "gpus.per_node"),
    "--wrap": ((), "nothing: mlenv writes the job script"),
    "--signal": ((), "slurm.signal"),
    "--requeue": ((), "slurm.requeue"),
    "--export": ((), "slurm.export (the names of your shell's variables to carry into the job)"),
}
"""sbatch options mlenv sets itself, their short forms, and the field to use instead."""
UNCATCHABLE = {"KILL": 9, "STOP": 19}
"""Signals a job cannot catch, so no warning: refused in slurm.signal."""
MAX_SIGNAL_SECONDS = 65535
"""sbatch's limit on the seconds of --signal."""
MIN_PREFIX = 3
"""sbatch takes unambiguous abbreviations of long options (``--outp``): a prefix this long of an owned option is
that option."""


@dataclass(frozen=True)
class SlurmSettings:
    """What the Slurm backend asks sbatch for, where jobs run and how Slurm is reached."""

    partition: str
    workdir: str
    """Absolute path on the cluster's shared filesystem: the jobs' working directory and sync's target."""
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    time: str | None = None
    nodelist: tuple[str, ...] = ()
    """Hosts to pin, in order; with fewer nodes asked, the first ones."""
    cpus_per_task: int | None = None
    mem: str | None = None
    setup: tuple[str, ...] = ()
    """Shell lines run before srun: the user's own code, inserted as written."""
    extra_sbatch: tuple[str, ...] = ()
    export: tuple[str, ...] = ()
    """Variables of the submitting shell that mlenv's jobs carry (``sbatch --export``); none without."""
    signal: str | None = None
    """``SIG@SECONDS`` (no ``B:``: batch scripts always get it in the batch shell, which passes it on)."""
    requeue: bool = False
    login: str | None = None
    """``[user@]host[:port]``: run Slurm commands over ssh there; None runs them on this machine."""
    login_identity_file: str | None = None
    login_known_hosts: str | None = None
    login_jump: str | None = None
    login_connect_timeout: int | None = None
    """How ssh reaches ``login`` (``slurm.ssh``); None: ssh's own configuration decides."""

    @property
    def signal_name(self) -> str | None:
        """The warning signal as bash's trap and scancel take it (``USR1``, ``10``)."""
        return self.signal.partition("@")[0] if self.signal else None

    @property
    def checkpoint_signal(self) -> str | None:
        """The warning signal as Python's ``signal`` module names it (``SIGUSR1``): the ranks' checkpoint signal."""
        name = self.signal_name
        if name is None:
            return None
        return signal.Signals(int(name)).name if name.isdigit() else f"SIG{name}"

    @property
    def signal_seconds(self) -> int:
        """How long before the time limit the warning comes (0 without one)."""
        return int(self.signal.partition("@")[2]) if self.signal else 0

    @property
    def sbatch_export(self) -> str:
        """sbatch's ``--export``: the names of ``export``, else NONE (Slurm's own SLURM_* variables either way)."""
        return ",".join(self.export) or "NONE"

    def to_data(self) -> JsonObject:
        """JsonValue-serialisable form, for handles."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self.__dict__.items()}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SlurmSettings:
        """Inverse of ``to_data``; TypeError on a record of another shape."""
        fields = {**data}
        fields.update({name: tuple(value) for name, value in data.items() if isinstance(value, list)})
        return cls(**fields)


def owned_option(option: str) -> tuple[str, str] | None:
    """(the owned sbatch option, the field to use instead) when ``option`` is one mlenv sets, else None."""
    name = option.split("=", 1)[0]
    for owned, (short, instead) in OWNED_OPTIONS.items():
        if name.startswith("--") and len(name) >= MIN_PREFIX + 2 and owned.startswith(name):
            return owned, instead
        if not name.startswith("--") and name[:2] in short:
            return owned, instead
    return None


def _extra_sbatch(reader: ClusterReader) -> tuple[str, ...]:
    options = tuple(reader.get("slurm", "extra_sbatch", default=[]))
    for index, option in enumerate(options):
        owned = owned_option(option)
        if owned is not None:
            reader.problem(("slurm", "extra_sbatch", index),
                           f"{show_value(option)} sets {owned[0]}, which mlenv sets itself; use {owned[1]}")
    return options


def parse_signal(text: str) -> str:
    """sbatch's ``[B:]SIG@SECONDS`` -> ``SIG@SECONDS`` (``SIGUSR1`` as ``USR1``); ValueError saying what is wrong."""
    body = text[2:] if text.startswith("B:") else text
    name, at, seconds = body.partition("@")
    if not at or not seconds.isdigit() or int(seconds) > MAX_SIGNAL_SECONDS:
        raise ValueError(f"expected sbatch's [B:]SIG@SECONDS like USR1@120 (SECONDS a whole number up to "
                         f"{MAX_SIGNAL_SECONDS}), got {show_value(text)}")
    if name.isdigit():
        number = int(name)
        if not 1 <= number < signal.NSIG:
            raise ValueError(f"{name} is not a signal number (1 to {signal.NSIG - 1})")
    else:
        name = name.upper().removeprefix("SIG")
        if getattr(signal, f"SIG{name}", None) is None or name in ("IGN", "DFL"):
            raise ValueError(f"{show_value(text)} names no signal: use a name like USR1, TERM, URG or a number")
        number = int(getattr(signal, f"SIG{name}"))
    if number in UNCATCHABLE.values():
        raise ValueError(f"{show_value(text)}: SIG{'KILL' if number == 9 else 'STOP'} cannot be caught, so it gives "
                         "the job no time to checkpoint; use USR1 (or another catchable signal)")
    return f"{name}@{int(seconds)}"


def _signal(reader: ClusterReader) -> str | None:
    value = reader.get("slurm", "signal")
    if value is None:
        return None
    try:
        return parse_signal(str(value))
    except ValueError as exc:
        reader.problem(("slurm", "signal"), str(exc))
        return None


def minutes(limit: str) -> float | None:
    """A Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``, ``infinite``) in minutes."""
    text = limit.strip().lower()
    if text in ("infinite", "unlimited"):
        return math.inf
    days, _, rest = text.rpartition("-")
    try:
        parts = [int(part) for part in rest.split(":")]
        if days:
            hours, mins, secs = ([*parts, 0, 0])[:3]
            return int(days) * 1440 + hours * 60 + mins + secs / 60
        if len(parts) == 1:
            return float(parts[0])
        if len(parts) == 2:
            return parts[0] + parts[1] / 60
        return parts[0] * 60 + parts[1] + parts[2] / 60
    except ValueError:
        return None


def _warning_lead(reader: ClusterReader, signal: str | None, time: str | None) -> None:
    """A warning (slurm.signal) as early as the time limit (slurm.time) or earlier comes at every start: the job
    would checkpoint and requeue forever."""
    limit = minutes(time) if time else None
    lead = int(signal.partition("@")[2]) if signal else 0
    if limit is None or not lead or lead < limit * 60:
        return
    line, col = reader.loaded.position(("slurm", "time"))
    reader.problem(("slurm", "signal"), f"{signal} warns {lead} s before the time limit, but slurm.time "
                                        f"({reader.loaded.path}:{line}:{col}) is {time}, {limit * 60:.0f} s: every "
                                        "start would get the warning at once, checkpoint and requeue; warn fewer "
                                        "seconds before the limit than slurm.time, or raise slurm.time")


def _nodelist(reader: ClusterReader) -> tuple[str, ...]:
    nodes = tuple(reader.get("slurm", "nodelist", default=[]))
    first: dict[str, int] = {}
    for index, node in enumerate(nodes):
        if node in first:
            reader.problem(("slurm", "nodelist", index), f"{node} is listed twice (first as nodelist[{first[node]}]); "
                                                         "one task runs per node, so list each node once")
        first.setdefault(node, index)
    asked = reader.get("gpus", "default_nodes")
    if nodes and isinstance(asked, (int, str)) and str(asked).isdigit() and int(asked) > len(set(nodes)):
        reader.problem(("gpus", "default_nodes"), f"{asked} nodes requested but only {len(set(nodes))} are pinned in "
                                                  "slurm.nodelist; lower gpus.default_nodes or pin more nodes")
    return nodes


def _login(reader: ClusterReader) -> str | None:
    # lazy for the cold start: a Slurm file's validation (mlenv render) would load ipaddress and urllib.parse (5 ms)
    from mlenv.backends.sshlink.hosts import HostError, parse_host

    login = reader.get("slurm", "login")
    if login is None:
        return None
    try:
        parse_host(login)
    except HostError as exc:
        reader.problem(("slurm", "login"), f"{exc}, got {show_value(login)}")
    return str(login)


class LoginSsh(TypedDict):
    """``slurm.ssh``, as the ``login_*`` fields of :class:`SlurmSettings`."""

    login_identity_file: str | None
    login_known_hosts: str | None
    login_jump: str | None
    login_connect_timeout: int | None


def _login_ssh(reader: ClusterReader) -> LoginSsh:
    """``slurm.ssh``: how ssh reaches the login host, checked as the ssh backend checks the same fields."""
    # lazy for the cold start, as _login's
    from mlenv.backends.sshlink.fields import jump_hosts, local_file

    if reader.get("slurm", "ssh") is not None and reader.get("slurm", "login") is None:
        reader.problem(("slurm", "ssh"), "slurm.ssh says how to reach slurm.login, which is not set: set "
                                         "slurm.login to the login host, or remove slurm.ssh")
    return {"login_identity_file": local_file(reader, "slurm", "ssh", "identity_file"),
            "login_known_hosts": local_file(reader, "slurm", "ssh", "known_hosts"),
            "login_jump": jump_hosts(reader, "slurm", "ssh", "jump"),
            "login_connect_timeout": reader.integer("slurm", "ssh", "connect_timeout", minimum=1, maximum=300)}


def _text(reader: ClusterReader, field: str) -> str | None:
    value = reader.get("slurm", field)
    return None if value is None else str(value)


def parse(reader: ClusterReader) -> SlurmSettings:
    """The Slurm backend's settings (BackendInfo.settings of ``slurm``)."""
    signal, time = _signal(reader), _text(reader, "time")
    _warning_lead(reader, signal, time)
    return SlurmSettings(
        partition=reader.get("slurm", "partition", default=""),
        workdir=str(reader.get("slurm", "workdir", default="/")).rstrip("/") or "/",
        account=_text(reader, "account"),
        qos=_text(reader, "qos"),
        reservation=_text(reader, "reservation"),
        constraint=_text(reader, "constraint"),
        time=time,
        nodelist=_nodelist(reader),
        cpus_per_task=reader.integer("slurm", "cpus_per_task", minimum=1, maximum=4096),
        mem=_text(reader, "mem"),
        setup=tuple(reader.get("slurm", "setup", default=[])),
        extra_sbatch=_extra_sbatch(reader),
        export=tuple(reader.get("slurm", "export", default=[])),
        signal=signal,
        requeue=bool(reader.get("slurm", "requeue", default=False)),
        login=_login(reader),
        **_login_ssh(reader),
    )
