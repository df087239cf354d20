"""Start a job on every node at once through the in-pod runtime, stream its output prefixed ``[node-N]``,
keep each node's log under runs/, and fail fast: the first node that fails stops all the others."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mlenv.backends.base import Backend
from mlenv.ops.fanout import run_parallel
from mlenv.plan import Deployment

STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
TAIL_LINES = 15


@dataclass(frozen=True)
class LaunchResult:
    """How the launch ended: the overall exit code, where the logs are and each node's exit code."""

    exit_code: int
    run_dir: Path
    node_exit_codes: Mapping[int, int]
    failed_node: int | None
    seconds: float
    stopped: frozenset[int] = frozenset()
    steps: Mapping[int, str] = field(default_factory=dict)

    def log(self, ordinal: int) -> Path:
        """The log file of node ``ordinal``."""
        return self.run_dir / f"node-{ordinal}.log"


def new_run_dir(app: str) -> Path:
    """runs/<UTC timestamp>-<app> in the project root, made unique with a suffix when needed."""
    from mlenv.config.discover import project_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    runs = project_root() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        candidate = runs / (f"{stamp}-{app}" if attempt == 1 else f"{stamp}-{app}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"cannot make a run directory under {runs}")


def runtime_argv(launcher: str, script: str, args: Sequence[str], nproc: int | None) -> list[str]:
    """The in-pod command that starts this node's share of the job."""
    return ["python3", "-m", "mlenv.runtime", "launch", "--launcher", launcher,
            *(["--nproc", str(nproc)] if nproc else []), "--", script, *args]


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def launch(backend: Backend, deployment: Deployment, launcher: str, script: str, args: Sequence[str] = (),
           nproc: int | None = None) -> LaunchResult:
    """Run ``script`` with ``launcher`` on every node; print a summary and, on failure, the failing node's
    last log lines."""
    from mlenv.ui import error, info

    pods = backend.pods(deployment)
    run_dir = new_run_dir(deployment.app)
    env = {"MLENV_RUN_ID": run_dir.name, "PYTHONUNBUFFERED": "1"}
    command = runtime_argv(launcher, script, args, nproc)
    commands = {p.ordinal: backend.exec_argv(deployment, p, command, env=env, stop_on_stdin_eof=True) for p in pods}
    logs = {p.ordinal: run_dir / f"node-{p.ordinal}.log" for p in pods}
    steps: dict[int, str] = {}

    def track(ordinal: int, line: str) -> None:
        if match := STEP.search(line):
            steps[ordinal] = f"{match.group(1)}/{match.group(2)}"

    info(f"launching {script} with {launcher} on {len(pods)} nodes of {deployment.app}; logs in {run_dir}")
    started = time.monotonic()
    outcome = run_parallel(commands, fail_fast=True, logs=logs, on_line=track, keep_stdin=True)
    result = LaunchResult(outcome.exit_code, run_dir, dict(outcome.exit_codes), outcome.first_failure,
                          round(time.monotonic() - started, 1), outcome.stopped, steps)
    _summary(result, [p.ordinal for p in pods])
    if outcome.interrupted:
        error(f"interrupted: every node stopped; logs in {run_dir}")
    elif result.failed_node is not None:
        node = result.failed_node
        error(f"node-{node} failed with exit code {result.node_exit_codes[node]}; the other nodes were stopped. "
              f"Last lines of {result.log(node)}:\n{_tail(result.log(node))}")
    return result


def _summary(result: LaunchResult, ordinals: Sequence[int]) -> None:
    from mlenv.ui import table

    def state(node: int) -> str:
        code = result.node_exit_codes.get(node, -1)
        if node in result.stopped:
            return f"stopped (exit {code})"
        return "ok" if code == 0 else f"failed ({code})"

    table(f"launch finished in {result.seconds} s (exit {result.exit_code})",
          ["NODE", "RESULT", "LAST STEP", "LOG"],
          [[f"node-{n}", state(n), result.steps.get(n, "-"), result.log(n)]
           for n in ordinals])
