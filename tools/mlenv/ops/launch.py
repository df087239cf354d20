"""``mlenv launch``: the backend's launch request for a script, run (or printed with --dry-run), each node's
output kept under runs/<run id>/, a summary at the end. The job's own exit code becomes launch's once it has
started; mlenv's failures before that keep 1 (operation) and 2 (bad input)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mlenv import state
from mlenv.core.capabilities import LaunchOutcome, LaunchSpec
from mlenv.errors import UsageError
from mlenv.ops.target import Target

STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
TAIL_LINES = 15


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended, where its logs are, and what each node reached."""

    outcome: LaunchOutcome
    run_id: str
    run_dir: Path
    seconds: float

    @property
    def exit_code(self) -> int:
        """The job's exit code (0 when every node succeeded)."""
        return self.outcome.exit_code

    def log(self, ordinal: int) -> Path:
        """The local copy of node ``ordinal``'s output."""
        return Path(self.outcome.logs.get(ordinal, self.run_dir / f"node-{ordinal}.log"))


def run_id(app: str) -> str:
    """``<UTC time>-<app>``, unique among the runs of this project."""
    from mlenv.config.discover import project_root

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    runs = project_root() / "runs"
    for attempt in range(1, 1000):
        candidate = f"{stamp}-{app}" if attempt == 1 else f"{stamp}-{app}-{attempt}"
        if not (runs / candidate).exists():
            return candidate
    raise UsageError(f"too many runs named {stamp}-{app}-N under {runs}")


def hang_timeout(target: Target) -> float | None:
    """``launch.hang_timeout`` of the deployment's cluster file, if it sets one and still loads."""
    from mlenv.ops.target import file_cluster

    cluster = file_cluster(target, "launch.hang_timeout")
    return cluster.hang_timeout if cluster else None


def _run_dir(run: str) -> Path:
    from mlenv.config.discover import project_root

    directory = project_root() / "runs" / run
    directory.mkdir(parents=True, exist_ok=False)
    return directory


def _secrets(names: tuple[str, ...]) -> dict[str, str]:
    missing = [name for name in names if name not in os.environ]
    if missing:
        raise UsageError(f"--env {missing[0]}: not set in your environment (export {missing[0]}=... first)")
    return {name: os.environ[name] for name in names}


def file_expect_transport(target: Target) -> str | None:
    """``network.expect_transport`` of the deployment's cluster file, if it sets one and still loads."""
    from mlenv.ops.target import file_cluster

    cluster = file_cluster(target, "network.expect_transport")
    return cluster.expect_transport if cluster else None


def dry_run(target: Target, spec: LaunchSpec) -> str:
    """What ``launch`` would run, as the backend prints it (secret values masked)."""
    return target.backend.jobs.prepare_launch(target.handle, spec).text


def launch(target: Target, spec: LaunchSpec) -> LaunchResult:
    """Run ``spec`` through the backend; print a summary and, on failure, the failing node's last log lines."""
    from mlenv.ui import error, info

    secrets = _secrets(spec.secrets)
    request = target.backend.jobs.prepare_launch(target.handle, spec)
    run_dir = _run_dir(spec.run_id)
    info(f"launching {spec.script} with {spec.launcher} on {target.handle.nodes} nodes of {target.handle.name}"
         f"{' (detached)' if spec.detach else ''}; logs in {run_dir}")
    started = time.monotonic()
    _remember(target, spec)  # before it starts: status, stacks and the hang watchdog's state see it while it runs
    outcome = target.backend.jobs.launch(target.handle, request, secrets, str(run_dir))
    result = LaunchResult(outcome, spec.run_id, run_dir, round(time.monotonic() - started, 1))
    if spec.detach:
        if outcome.exit_code == 0:
            info(f"run {spec.run_id} started in the background: mlenv logs -f follows it, mlenv stop stops it")
        return result
    if outcome.node_exit_codes:
        _summary(result)
    if outcome.message:
        error(outcome.message)
    if outcome.interrupted:
        error(f"interrupted: every node stopped; logs in {run_dir}")
    elif outcome.failed_node is not None:
        node = outcome.failed_node
        error(f"node-{node} failed with exit code {outcome.node_exit_codes[node]}; the other nodes were stopped. "
              f"Last lines of {result.log(node)}:\n{_tail(result.log(node))}")
    return result


def _remember(target: Target, spec: LaunchSpec) -> None:
    """Record a run on the deployment, so status, logs and stop know of it (attached runs too: another terminal
    may ask while it runs)."""
    if target.recorded is None:
        return
    run = {"id": spec.run_id, "script": spec.script, "launcher": spec.launcher, "detached": spec.detach,
           "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    known = state.load().deployments.get(target.recorded.name)
    runs = (*(known.runs if known else ()), run)[-20:]
    state.update(target.recorded.name, runs=runs)


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _last_step(path: Path) -> str:
    try:
        found = STEP.findall(path.read_text(errors="replace"))
    except OSError:
        return "-"
    return f"{found[-1][0]}/{found[-1][1]}" if found else "-"


def _summary(result: LaunchResult) -> None:
    from mlenv.ui import table

    outcome = result.outcome

    def verdict(node: int) -> str:
        code = outcome.node_exit_codes.get(node, -1)
        if node in outcome.stopped:
            return f"stopped (exit {code})"
        return "ok" if code == 0 else f"failed ({code})"

    table(f"launch finished in {result.seconds} s (exit {result.exit_code})",
          ["NODE", "RESULT", "LAST STEP", "LOG"],
          [[f"node-{n}", verdict(n), _last_step(result.log(n)), result.log(n)]
           for n in sorted(outcome.node_exit_codes)])
