"""The run layout every backend writes (docs/runs.md), and the records kept in it.

Under a runs root (``$MLENV_RUNS_ROOT``, else ``.mlenv/runs`` in the workspace; it may be shared by several hosts)::

    <run_id>/attempt-<K>/node<R>/{record.json, output.log, exit, ranks.json, state.json, stacks/}

``K`` is ``MLENV_RESTART_COUNT`` (0 for the first attempt), ``R`` the node rank. Readers take the newest attempt.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .jsonvalue import JsonObject
from .states import NodeFault, RunState

DEFAULT_RUNS_ROOT = Path(".mlenv", "runs")
ATTEMPT_VARIABLE = "MLENV_RESTART_COUNT"
CHECKPOINT_VARIABLE = "MLENV_CHECKPOINT_DIR"
CHECKPOINT_SIGNAL_VARIABLE = "MLENV_CHECKPOINT_SIGNAL"
"""Names the signal the ranks get before the run is taken away (``SIGTERM`` from a pod's PID 1 on Kubernetes;
slurm.signal's on a Slurm batch job), so that one handler in the training script saves the checkpoint everywhere."""

LOST_FILE = "lost.json"
"""In an attempt's directory (Slurm): ``{"<node>": {"sign", "evidence"}}``, the nodes the scheduler lost while the
attempt ran (written by the run's script, through the runtime's ``policy``)."""
PREEMPTED_MARK = "MLENV_PREEMPTED_MARK"
"""Names a file that the pod's PID 1 writes when the pod is deleted or evicted, before it passes the SIGTERM on
(Kubernetes: the pod template sets it): a stop while it exists is a preemption, recorded ``preempted``."""

RESUME_RUN = "MLENV_RESUME_RUN"
"""Names the detached run a pod that comes back after a preemption resumes (Kubernetes: a file of the run's Secret)."""
MOVES_PODS = "MLENV_KUBE_STATEFULSET"
"""Names the StatefulSet whose pods a detached run may move off a faulty node (Kubernetes: the pod template sets it
only with scheduling.move_faulty_pods; supervise/kubemove.py)."""
MOVE_DIR = "MLENV_MOVE_DIR"
"""Names the directory where node 0's supervisor asks the pod's mover to move the run's pods (Kubernetes: the pod
template sets it only with scheduling.move_faulty_pods; supervise/podmover.py)."""
LEFT_OUT = "MLENV_LEFT_OUT"
"""The pod template's :data:`LEFT_OUT_ANNOTATION` through the downward API (empty when there is none)."""
LEFT_OUT_ANNOTATION = "mlenv.io/left-out"
"""The pod template's record of a detached run's last move of its pods: ``{"run", "attempt", "env", "nodes":
[{"node", "host", "reason", "saved", "since"}]}``; the same on the StatefulSet's own metadata as
:data:`LEFT_OUT_UNRECORDED` until mlenv has recorded the nodes on the deployment (a change there replaces no pod)."""
LEFT_OUT_UNRECORDED = "mlenv.io/left-out-unrecorded"
RUN_SECRETS = "MLENV_RUN_SECRETS"
"""Names the directory of the run's Secret in a pod (Kubernetes): a file per variable (the control secret, the
secrets forwarded with --env, RESUME_RUN), which the runtime's ``resume`` reads into the resumed share's environment."""

_ATTEMPT = re.compile(r"attempt-(\d+)")
_NODE = re.compile(r"node(\d+)")


@dataclass(frozen=True)
class NodeDir:
    """One node's directory of one attempt of a run: ``<run_dir>/attempt-<K>/node<R>``."""

    run_dir: Path
    attempt: int
    node: int

    @property
    def path(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}" / f"node{self.node}"

    @property
    def record(self) -> Path:
        """The node supervisor's record (pid, start ticks, host, argv, attempt)."""
        return self.path / "record.json"

    @property
    def log(self) -> Path:
        """Every line of every rank of this node, whole and tagged ``[node-R rN] text``."""
        return self.path / "output.log"

    @property
    def exit(self) -> Path:
        """The node's exit status, written once it has ended."""
        return self.path / "exit"

    @property
    def ranks(self) -> Path:
        """``[RankRecord...]``, rewritten atomically on every rank event."""
        return self.path / "ranks.json"

    @property
    def state(self) -> Path:
        """``{"state", "reason", "first_failure", ...}``: what became of this node's share."""
        return self.path / "state.json"

    @property
    def stacks(self) -> Path:
        return self.path / "stacks"


def runs_root(environ: Mapping[str, str]) -> Path:
    """``$MLENV_RUNS_ROOT``, else ``.mlenv/runs`` in the current directory (the workspace)."""
    return Path(environ["MLENV_RUNS_ROOT"]) if environ.get("MLENV_RUNS_ROOT") else DEFAULT_RUNS_ROOT


def attempt_of(environ: Mapping[str, str]) -> int:
    """This attempt's number: ``MLENV_RESTART_COUNT`` (mlenv restarts, Slurm requeues), else 0."""
    text = environ.get(ATTEMPT_VARIABLE, "")
    return int(text) if text.isdigit() else 0


def absolute_checkpoint_dir(environ: Mapping[str, str], workdir: Path) -> dict[str, str]:
    """``environ`` with ``MLENV_CHECKPOINT_DIR`` made absolute against ``workdir`` (the run's working directory when
    the node's share starts), so a script that changes directory still finds it; every later attempt inherits the
    absolute path. Nothing else changes, nor an unset or already absolute one."""
    value = environ.get(CHECKPOINT_VARIABLE)
    if not value or os.path.isabs(value):
        return dict(environ)
    return {**environ, CHECKPOINT_VARIABLE: os.path.normpath(os.path.join(os.path.abspath(workdir), value))}


def attempts(run_dir: Path) -> list[int]:
    """The attempts a run directory holds, oldest first."""
    found = (_ATTEMPT.fullmatch(entry.name) for entry in _entries(run_dir))
    return sorted(int(match[1]) for match in found if match)


def node_dirs(run_dir: Path, attempt: int) -> list[NodeDir]:
    """The node directories of one attempt, by node rank."""
    found = (_NODE.fullmatch(entry.name) for entry in _entries(run_dir / f"attempt-{attempt}"))
    return [NodeDir(run_dir, attempt, node) for node in sorted(int(match[1]) for match in found if match)]


def resume_file(run_dir: Path, node: int) -> Path:
    """How node ``node`` started its share of a detached run (argv, the run's variables, directory): what its pod,
    back after a preemption, starts again (detached.py ``resume``). No secret is in it."""
    return run_dir / "resume" / f"node{node}.json"


def latest_node_dirs(run_dir: Path) -> list[NodeDir]:
    """The node directories of the newest attempt of a run (empty when it has none yet)."""
    numbers = attempts(run_dir)
    return node_dirs(run_dir, numbers[-1]) if numbers else []


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


@dataclass(frozen=True)
class RankRecord:
    """One rank as its node supervisor saw it; ``rank`` is the global rank from the worker's own ``RANK``."""

    rank: int
    local_rank: int
    node: int
    host: str
    pid: int  # the user's training process
    state: RunState  # running, succeeded, failed or stopped
    exit_code: int | None  # 128 + N when killed by signal N
    signal: str | None  # "SIGKILL", or None
    started_at: str  # ISO 8601, UTC
    ended_at: str | None
    last_output_at: str | None

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankRecord:
        """ValueError/KeyError/TypeError on another shape."""
        return cls(int(data["rank"]), int(data["local_rank"]), int(data["node"]), str(data["host"]),
                   int(data["pid"]), RunState(data["state"]), _int_or_none(data["exit_code"]),
                   _str_or_none(data["signal"]), str(data["started_at"]), _str_or_none(data["ended_at"]),
                   _str_or_none(data["last_output_at"]))


@dataclass(frozen=True)
class FirstFailure:
    """The first rank of the job to fail, and why, in the words of ``describe``."""

    rank: int
    node: int
    exit_code: int
    signal: str | None
    reason: str  # "exited with 7", "killed by SIGSEGV", "killed by the kernel's OOM killer"
    log_tail: list[str]
    node_fault: NodeFault | None = None
    """The failing rank's node's fault sign (faultsigns.py), when its failure carries one."""
    host: str | None = None
    """The failing rank's host (a spare host may run a node in a later attempt)."""

    def to_dict(self) -> JsonObject:
        return {**asdict(self), "node_fault": self.node_fault.to_dict() if self.node_fault is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FirstFailure:
        """ValueError/KeyError/TypeError on another shape."""
        return cls(int(data["rank"]), int(data["node"]), int(data["exit_code"]), _str_or_none(data["signal"]),
                   str(data["reason"]), [str(line) for line in data["log_tail"]],
                   NodeFault.parse(data.get("node_fault")), _str_or_none(data.get("host")))

    @classmethod
    def parse(cls, data: object) -> FirstFailure | None:
        """The first failure recorded as ``data`` (state.json's ``first_failure``); None when nothing failed first,
        or the record is not one."""
        try:
            return cls.from_dict(data) if isinstance(data, Mapping) else None
        except (KeyError, TypeError, ValueError):
            return None


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(str(value))


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` at once, so that readers see the old or the new content, never a part."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    temporary.replace(path)


def write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def read_json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_ranks(node_dir: NodeDir) -> list[RankRecord]:
    """The node's ranks.json (empty when missing or unreadable)."""
    return parse_ranks(read_json(node_dir.ranks))


def parse_ranks(data: object) -> list[RankRecord]:
    """The ranks of a ranks.json's JSON (empty when it is not a list of RankRecords)."""
    try:
        return [RankRecord.from_dict(item) for item in data] if isinstance(data, list) else []
    except (KeyError, TypeError, ValueError):
        return []


def read_state(node_dir: NodeDir) -> JsonObject:
    """The node's state.json (empty when missing or unreadable)."""
    data = read_json(node_dir.state)
    return data if isinstance(data, dict) else {}
