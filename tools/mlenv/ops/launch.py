"""``mlenv launch``: the backend's launch request for a script, run (or printed with --dry-run), each node's
output kept under runs/<run id>/, a summary at the end. The job's own exit code becomes launch's once it has
started; mlenv's failures before that keep 1 (operation) and 2 (bad input)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from mlenv import state
from mlenv.config.discover import project_root
from mlenv.core.capabilities import Feature, LaunchOutcome, LaunchSpec
from mlenv.core.recorded import ExcludedNode, RecordedRun
from mlenv.errors import MlenvError, OperationError, UsageError, shown
from mlenv.ops.doctor import answer, ask_nodes
from mlenv.ops.live import refuse_while_live
from mlenv.ops.spares import announce
from mlenv.ops.target import Target, file_cluster, resolve
from mlenv.parallel import run_parallel
from mlenv.runtime.launchers import LAUNCHABLE
from mlenv.runtime.records import restartpolicy
from mlenv.runtime.records.attempts import run_attempts
from mlenv.runtime.records.goodput import Goodput
from mlenv.runtime.records.restartpolicy import IDLE_EXIT_CODE, LOST_SIGNS, AttemptEnd, why_faulty
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import Ending, FaultSign, LeftOut, NodeEnd, NodeFault, RunState, end_text, exit_state
from mlenv.ui import error, info, table, warn

STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
TAIL_LINES = 15
KEPT_RUNS = 20
"""The newest runs a deployment's record keeps."""


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended, where its logs are, and what each node reached."""

    outcome: LaunchOutcome
    run_id: str
    run_dir: Path
    seconds: float
    latest_run: RunRecord | None = None
    """The run as its nodes' supervisors recorded it, read once when an attached attempt failed (None otherwise, or
    where the backend keeps no such records)."""
    attempt: int = 0
    """The attempt it is (MLENV_RESTART_COUNT)."""
    goodput: Goodput | None = None
    """Where the wall time of an attached run went (runtime/records/goodput.py), once it ended."""

    @property
    def exit_code(self) -> int:
        """The job's exit code (0 when every node succeeded)."""
        return self.outcome.exit_code

    def log(self, ordinal: int) -> Path:
        """The local copy of node ``ordinal``'s output."""
        return Path(self.outcome.logs.get(ordinal, self.run_dir / f"node-{ordinal}.log"))

    def to_dict(self, cluster: str) -> dict[str, object]:
        """``launch --json`` (docs/json.md): the run; once an attached run ended, its exit code and first failure
        (``exit_code`` null while a detached run goes on)."""
        outcome = self.outcome
        going = outcome.detached and outcome.exit_code == 0
        failure = self.latest_run.first_failure if self.latest_run is not None else None
        return {"ok": outcome.exit_code == 0, "run_id": self.run_id, "cluster": cluster, "detached": outcome.detached,
                "run_dir": str(self.run_dir), "exit_code": None if going else outcome.exit_code,
                "attempt": self.attempt, "duration": self.seconds,
                "first_failure": failure.to_dict() if failure is not None else None,
                "goodput": self.goodput.to_json() if self.goodput is not None else None}


def run_id(app: str) -> str:
    """``<UTC time>-<app>``: the run's id, unless a run of the same second has it (``_new_run`` then adds a
    suffix)."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{app}"


SAME_SECOND = 9
"""The runs of one id's second: the plain id, then ``-2`` to ``-9``, one digit, so that names sort by time."""


def _new_run(spec: LaunchSpec) -> tuple[LaunchSpec, Path]:
    """``spec`` with a run id of its own and that run's local directory, made here: ``runs/<run id>``, else the
    first of ``<run id>-2`` to ``-9`` not taken (each made atomically, so two launches never get the same)."""
    runs = project_root() / "runs"
    try:
        runs.mkdir(parents=True, exist_ok=True)
        for suffix in ("", *(f"-{number}" for number in range(2, SAME_SECOND + 1))):
            try:
                (runs / f"{spec.run_id}{suffix}").mkdir()
            except FileExistsError:
                continue
            return replace(spec, run_id=f"{spec.run_id}{suffix}"), runs / f"{spec.run_id}{suffix}"
    except OSError as exc:
        raise OperationError(f"cannot make the run's directory under {shown(str(runs))}: "
                             f"{exc.strerror or exc}") from None
    raise OperationError(f"{spec.run_id} and {spec.run_id}-2 to -{SAME_SECOND} are taken under {shown(str(runs))}: "
                         "launch again in a second")


def _secrets(names: tuple[str, ...]) -> dict[str, str]:
    missing = [name for name in names if name not in os.environ]
    if missing:
        raise UsageError(f"--env {missing[0]}: not set in your environment (export {missing[0]}=... first)")
    return {name: os.environ[name] for name in names}


@dataclass(frozen=True)
class LaunchSettings:
    """A launch's settings, resolved once (``settings``): what the user typed, over the cluster file's ``launch:``
    section and ``network.expect_transport``, over the defaults; checked together."""

    target: Target
    run_id: str
    hang_timeout: float | None
    on_hang: str | None
    idle_seconds: int | None
    idle_util: float | None
    on_idle: str | None
    expect_transport: str | None
    max_restarts: int
    max_preemptions: int | None = None
    on_straggler: str | None = None
    node_silence: float | None = None

    def spec(self, launcher: str, script: str, args: tuple[str, ...], nproc: int | None, detach: bool,
             secrets: tuple[str, ...]) -> LaunchSpec:
        """The launch request of ``script`` with these settings."""
        return LaunchSpec(launcher, script, args, nproc, self.run_id, detach, secrets, self.expect_transport,
                          self.hang_timeout, self.on_hang, self.max_restarts, self.max_preemptions,
                          idle_seconds=self.idle_seconds, idle_util=self.idle_util, on_idle=self.on_idle,
                          on_straggler=self.on_straggler, node_silence=self.node_silence)


def settings(cluster_ref: str | None, *, hang_timeout: float | None, on_hang: str | None, on_idle: str | None,
             expect_transport: str | None, max_restarts: int | None,
             max_preemptions: int | None = None, on_straggler: str | None = None) -> LaunchSettings:
    """The settings of a launch on ``cluster_ref`` (ops.target.resolve), the options typed (None: not typed) over
    the deployment's cluster file, read once (a file that no longer loads is warned about once, its settings
    left at their defaults), over the defaults (no hang or idle watch, restarts 0). UsageError where they do not go
    together: a hang timeout that is not a positive number, --on-hang without a hang timeout, --on-idle without
    launch.idle_minutes."""
    if hang_timeout is not None and not 0 < hang_timeout < float("inf"):
        raise UsageError(f"--hang-timeout: expected a positive number of seconds, got {hang_timeout:g}")
    target = resolve(cluster_ref)
    wanted = [name for name, typed in (("launch.hang_timeout", hang_timeout), ("launch.idle_minutes", None),
                                       ("launch.node_silence", None),
                                       ("network.expect_transport", expect_transport),
                                       ("launch.max_restarts", max_restarts)) if typed is None]
    cluster = file_cluster(target, ", ".join(wanted))
    hang_timeout = hang_timeout or (cluster.hang_timeout if cluster else None)
    if on_hang and not hang_timeout:
        raise UsageError("--on-hang stop needs a hang timeout: --hang-timeout SECONDS (or launch.hang_timeout)")
    idle_seconds, idle_util = (cluster.idle_seconds, cluster.idle_util) if cluster else (None, None)
    if on_idle and not idle_seconds:
        raise UsageError(f"--on-idle {on_idle} needs launch.idle_minutes in the cluster file (e.g. idle_minutes: 30m)")
    return LaunchSettings(target, run_id(target.handle.name), hang_timeout, on_hang, idle_seconds, idle_util, on_idle,
                          expect_transport or (cluster.expect_transport if cluster else None),
                          max_restarts if max_restarts is not None else cluster.max_restarts if cluster else 0,
                          max_preemptions, on_straggler, cluster.node_silence if cluster else None)


def dry_run(target: Target, spec: LaunchSpec) -> str:
    """What ``launch`` would run, as the backend prints it (secret values masked): away from the excluded nodes."""
    spec = without_excluded(target, spec)
    check_supported(target, spec)
    return target.backend.jobs.prepare_launch(target.handle, spec).text


def check_supported(target: Target, spec: LaunchSpec) -> None:
    """UsageError (exit 2) where the backend cannot do what ``spec`` asks (core/registry.py says why): resume after
    a preemption (--max-preemptions, attached or detached), leave the excluded nodes out."""
    info = target.backend.info
    if spec.max_preemptions is not None:
        info.require(Feature.PREEMPTION)
    if spec.exclude:
        info.require(Feature.NODE_EXCLUSION)


def without_excluded(target: Target, spec: LaunchSpec) -> LaunchSpec:
    """``spec`` away from the hosts recorded as excluded on the deployment (as read with it), or on the cluster
    when it is not deployed (mlenv nodes lists them)."""
    recorded = target.recorded.excluded if target.recorded else state.load().excluded_of(target.handle.name)
    excluded = {entry.host for entry in recorded}
    return replace(spec, exclude=tuple(sorted({*spec.exclude, *excluded})))


SSH_UNREACHABLE = 255
RESUME_TIMEOUT = 900.0
"""Seconds a preempted run's nodes get to be back (a reason the backend gives that lasts ends it sooner)."""
"""ssh's exit status when it cannot reach the host (or the connection broke)."""


def restartable(outcome: LaunchOutcome) -> bool:
    """Whether the restart policy may be asked about a finished attached run (runtime/records/restartpolicy.py
    ``may_restart`` decides, with the run's records): not a success, not interrupted here, not detached, and not a
    run that never started (mlenv's own failure, with no node's exit code)."""
    return (not outcome.interrupted and not outcome.detached and bool(outcome.node_exit_codes)
            and outcome.exit_code != 0)


def launch(target: Target, spec: LaunchSpec, keep: Collection[int] = ()) -> LaunchResult:
    """Run ``spec``, and again up to ``spec.max_restarts`` times while it fails and the restart policy allows
    (runtime/records/restartpolicy.py; same run id, MLENV_RESTART_COUNT the attempt), away from the excluded nodes (the
    deployment's, or the cluster's when it is not deployed) and from the nodes the policy leaves out
    (runtime/records/attempts.py's loop), but for the nodes ``keep`` (``mlenv drill``: its own fault left the node
    sound); the last attempt's result. A detached run is restarted from the nodes (local and ssh: their
    supervisors; Slurm: the run's script), where the backend can. One launch of a deployment at a time looks for a
    live run (``refuse_while_live``) and records its own, with an id of its own (``_new_run``), under the
    deployment's launch lock; ``state.running`` then holds the run live for the next launch until this one returns
    (a detached run's nodes started it, an attached run ended)."""
    launched = time.time()
    name = target.handle.name
    with ExitStack() as going, ExitStack() as looking:
        looking.enter_context(state.launching(name))  # until this run is recorded: the next launch then sees it
        if target.recorded is not None:  # as it is now, with the runs other launches recorded
            target = replace(target, recorded=state.load().deployments.get(name))
        refuse_while_live(target)
        check_nodes(target, spec)
        spec = without_excluded(target, spec)
        check_supported(target, spec)
        spec, run_dir = _new_run(spec)
        going.enter_context(state.running(name))  # live for the next launch until its nodes say so or it ended
        return _attempts(target, spec, run_dir, keep, launched, recorded=looking.close)


def _attempts(target: Target, spec: LaunchSpec, run_dir: Path, keep: Collection[int], launched: float,
              recorded: Callable[[], None]) -> LaunchResult:
    """``launch``'s attempts of its run (runtime/records/attempts.py's loop), ``recorded`` called once the first is
    recorded; the last one's result, with its goodput (``launched``: when the launch began)."""
    attached = _Attached(target, spec, run_dir, keep, recorded,
                         saved=_reasons(target.recorded.excluded if target.recorded else ()))
    run_attempts(attached.start, attached.go_on, spec.attempt, spec.max_restarts)
    assert attached.result is not None  # noqa: S101  # an attempt ran
    return _with_goodput(target, attached.result, launched)


@dataclass
class _Attached:
    """An attached run's attempts: each started through the backend, a preempted one resumed as the next (not
    counted as a restart), the nodes the policy leaves out excluded from the next."""

    target: Target
    spec: LaunchSpec
    run_dir: Path
    keep: Collection[int]
    """Nodes never left out (``mlenv drill``: its own fault left the node sound)."""
    recorded: Callable[[], None]
    saved: dict[str, str]
    """host -> why, as the deployment records its excluded nodes."""
    run_only: dict[str, str] = field(default_factory=dict)
    """host -> why, for the nodes left out of this run only."""
    preemptions: int = 0
    result: LaunchResult | None = None

    def start(self, attempt: int) -> AttemptEnd:
        """Attempt ``attempt`` (and the resumptions of a preempted one) to its end; how it ended, from the run's
        records where the policy may be asked."""
        self.spec = replace(self.spec, attempt=attempt)
        first = self.result is None
        result = self._attempt(self.run_dir if first else self.run_dir / f"attempt-{attempt}", self.recorded)
        spec = self.spec
        while preempted(result.outcome):
            if spec.max_preemptions is not None and self.preemptions >= spec.max_preemptions:
                error(f"run {spec.run_id}: preempted again after {self.preemptions} resumptions "
                      f"(--max-preemptions {spec.max_preemptions}): not resuming it")
                return AttemptEnd(result.exit_code, spec.attempt, final=True)
            self.preemptions += 1
            spec = self.spec = _resume(self.target, spec, result.outcome, self.preemptions)
            result = self._attempt(self.run_dir / f"attempt-{spec.attempt}")
        if not restartable(result.outcome) or spec.attempt - self.preemptions >= spec.max_restarts:
            return AttemptEnd(result.exit_code, spec.attempt, final=True)
        run = result.latest_run or self.target.backend.jobs.latest_run(self.target.handle, spec.run_id)
        # one attempt counter per run: the newest attempt its records hold (a Slurm requeue may have started one)
        newest = max(spec.attempt, run.attempt)
        return replace(attempt_facts(result.outcome, run, newest), restarts=newest - self.preemptions)

    def _attempt(self, run_dir: Path, recorded: Callable[[], None] = lambda: None) -> LaunchResult:
        self.result = _attempt(self.target, self.spec, run_dir, {**self.run_only, **self.saved}, recorded)
        return self.result

    def go_on(self, end: AttemptEnd, verdict: restartpolicy.Verdict | None) -> int | None:
        """The next attempt, away from the nodes ``verdict`` leaves out (but ``keep``); None: the run ends."""
        if verdict is None or self.result is None:
            return None
        spec, outcome = self.spec, self.result.outcome
        left_out = tuple(out for out in verdict.left_out if out.node not in self.keep)
        if verdict.stop is not None:
            error(f"run {spec.run_id}: {verdict.stop}")
            return None
        backend = self.target.backend
        if left_out and not backend.info.supports(Feature.NODE_EXCLUSION):
            lacking = backend.info.unsupported[Feature.NODE_EXCLUSION]
            first = left_out[0]
            error(f"run {spec.run_id}: {outcome.hosts.get(first.node, '?')} (node-{first.node}) must be left "
                  f"out ({first.reason}), and the {backend.name} backend cannot "
                  f"{Feature.NODE_EXCLUSION.value}; {lacking}")
            return None
        faulty = _exclude(self.target, outcome, left_out, self.run_only, self.saved)
        spec = self.spec = replace(spec, attempt=end.attempt + 1, exclude=tuple(sorted({*spec.exclude, *faulty})))
        warn(f"run {spec.run_id} failed with exit code {self.result.exit_code}: restarting it, attempt {spec.attempt}"
             + (f" (restart {spec.attempt - self.preemptions})" if self.preemptions else "")
             + f" of at most {spec.max_restarts} restarts (MLENV_RESTART_COUNT={spec.attempt})"
             + (f" without {', '.join(spec.exclude)}" if spec.exclude else ""))
        return spec.attempt


def _with_goodput(target: Target, result: LaunchResult, launched: float) -> LaunchResult:
    """An attached run that ran, with its goodput as its nodes recorded it (``mlenv launch`` says it last; the drill
    in its report)."""
    if result.outcome.detached or result.outcome.interrupted or not result.outcome.node_exit_codes \
            or not target.backend.info.supports(Feature.JOBS):
        return result
    try:
        found = target.backend.jobs.latest_run(target.handle, result.run_id).launched(launched, time.time()).goodput
    except MlenvError:  # the nodes cannot be read now: the launch's own result stands
        return result
    return replace(result, goodput=found)


def check_nodes(target: Target, spec: LaunchSpec) -> None:
    """UsageError (exit 2) before anything is started or recorded: a node whose workspace lacks the script, or whose
    Python, as a launch there gets it, lacks the launcher's modules (torch; DeepSpeed's too), from one runtime
    command on every node at once (``launchable``). A node whose runtime does not answer (never synced) is asked
    whether its workspace has the script (``test -f`` says 1); a node that cannot tell (not running, exec failing)
    is left to the launch to judge. A backend that cannot launch says so first."""
    target.backend.info.require(Feature.JOBS)
    access = target.backend.access
    try:
        nodes = [node for node in access.nodes(target.handle) if node.ready]
    except OperationError:  # no node to ask (none running, the cluster out of reach): the launch says why
        return
    lines = ask_nodes(access, target.handle, nodes, ["launchable", "--launcher", spec.launcher, "--", spec.script])
    answers = {n.ordinal: found[0] for n in nodes if (found := answer(lines[n.ordinal], LAUNCHABLE)) is not None}
    holding = nodes[:1] if target.handle.shared_workspace else nodes  # the workspaces the script must be in
    unanswered = [n for n in holding if n.ordinal not in answers]
    asked = run_parallel({n.ordinal: access.exec_argv(target.handle, n, ["test", "-f", spec.script])
                          for n in unanswered}, echo=False).exit_codes if unanswered else {}
    missing = [f"node-{n.ordinal} ({n.name})" for n in holding
               if (not answers[n.ordinal]["script"] if n.ordinal in answers else asked.get(n.ordinal) == 1)]
    if missing:
        local = project_root() / "workspace" / spec.script
        raise UsageError(f"{spec.script}: no such file in the workspace of {', '.join(missing)}: "
                         + ("not synced yet: mlenv sync copies workspace/ to the nodes" if local.is_file() else
                            "mlenv sync copies workspace/ (or --source DIR) to the nodes"))
    lacking = {ordinal: said for ordinal, said in answers.items() if said["missing"]}
    groups: dict[tuple[tuple[str, ...], str], list[str]] = {}  # (the modules, the Python) -> the nodes
    for ordinal, said in lacking.items():
        modules = said["missing"]
        groups.setdefault((tuple(map(str, modules)) if isinstance(modules, list) else (str(modules),),
                           shown(str(said["python"]))), []).append(f"node-{ordinal}'s")
    if groups:
        raise UsageError("; ".join(f"{_listed(modules)} {'are' if len(modules) > 1 else 'is'} not installed in "
                                   f"{_listed(names)} Python ({python})" for (modules, python), names in groups.items())
                         + f": {next(iter(lacking.values()))['fix']}")


def _listed(words: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def preempted(outcome: LaunchOutcome) -> bool:
    """Whether an attached attempt ended because nodes were taken away under it (not a failure, not a user's stop:
    it resumes)."""
    return bool(outcome.preempted) and not outcome.interrupted and not outcome.detached and outcome.exit_code != 0


def _resume(target: Target, spec: LaunchSpec, outcome: LaunchOutcome, preemptions: int) -> LaunchSpec:
    """Say the run was preempted, wait until its nodes are back (the backend's readiness wait), and give the next
    attempt: same run id and checkpoint directory, MLENV_RESTART_COUNT + 1."""
    nodes = ", ".join(f"node-{node} ({outcome.hosts.get(node, '?')})" for node in sorted(outcome.preempted))
    limit = "" if spec.max_preemptions is None else f" of at most {spec.max_preemptions}"
    warn(f"run {spec.run_id} preempted: {nodes} taken away under it (deleted or evicted); resuming it as attempt "
         f"{spec.attempt + 1} once they are back (resumption {preemptions}{limit}; MLENV_RESTART_COUNT="
         f"{spec.attempt + 1}, the same MLENV_CHECKPOINT_DIR)")
    if target.recorded is not None:  # status counts the resumptions apart from the restarts
        state.update(target.recorded.name, runs=lambda runs: tuple(
            replace(run, preemptions=preemptions) if run.id == spec.run_id else run for run in runs))
    target.backend.deploy.wait_ready(target.handle, RESUME_TIMEOUT, lambda handle: None)
    return replace(spec, attempt=spec.attempt + 1)


def attempt_facts(outcome: LaunchOutcome, run: RunRecord | None, attempt: int) -> AttemptEnd:
    """How failed attached attempt ``attempt`` ended, as the restart policy reads it
    (runtime/records/restartpolicy.py ``AttemptEnd``), from what the nodes' supervisors recorded (``run``; None
    where the backend keeps no records): the first failure (where there are no records, the node whose launch ended
    first with a failure), and the nodes' own signs: a lost supervisor or failed in-node check, and ``unreachable``
    for ssh's exit 255 where the node has no record of the run."""
    signs = dict(run.node_faults) if run is not None else {}
    for ordinal, code in outcome.node_exit_codes.items():
        if run is not None and code == SSH_UNREACHABLE and run.nodes.get(ordinal) is None and (
                ordinal not in signs or signs[ordinal].closed):  # says more than node 0's closed channel
            signs[ordinal] = NodeFault(FaultSign.UNREACHABLE, f"exit {code} and no record of the run there")
    first = run.first_failure if run is not None else None
    # a run stopped without a rank's failure (an observer, a lost node) has no node that failed first
    node = first.node if first is not None else outcome.failed_node if run is None else None
    if node not in outcome.hosts:
        node = first = None
    return AttemptEnd(outcome.exit_code, attempt, first, node, outcome.hosts.get(node) if node is not None else None,
                      {faulty: sign for faulty, sign in signs.items() if faulty in outcome.hosts})


def _reasons(excluded: Iterable[ExcludedNode]) -> dict[str, str]:
    """host -> why, of the excluded nodes ``excluded`` as state.json records them."""
    return {entry.host: entry.reason for entry in excluded}


def _exclude(target: Target, outcome: LaunchOutcome, left_out: tuple[LeftOut, ...],
             run_only: dict[str, str], saved: dict[str, str]) -> list[str]:
    """The hosts of the nodes the policy leaves out: named with why; recorded as excluded on the deployment, or on
    the cluster when it is not deployed (mlenv nodes shows them), where a node-fault sign says so (the deployment's
    excluded nodes afterwards go to ``saved``, host -> why), else kept in ``run_only`` (host -> why) for the rest
    of this run."""
    for out in left_out:
        warn(f"excluding {outcome.hosts[out.node]} (node-{out.node}) from the next attempts: {out.reason}"
             + ("" if out.saved else " (this run only: without a node-fault sign it is not recorded for later runs)"))
    recording = {out.node: (outcome.hosts[out.node], out.reason) for out in left_out if out.saved}
    if recording:
        excluded = state.exclude(target.handle.name, recording)
        if target.recorded is not None:
            saved.update(_reasons(excluded))
    run_only.update({outcome.hosts[out.node]: out.reason for out in left_out if not out.saved})
    return [outcome.hosts[out.node] for out in left_out]


def _attempt(target: Target, spec: LaunchSpec, run_dir: Path, reasons: Mapping[str, str],
             recorded: Callable[[], None] = lambda: None) -> LaunchResult:
    """One start of ``spec`` through the backend, its local logs in ``run_dir`` (the run's, or attempt-K/ in it); a
    summary and, on failure, the failing node's last log lines. ``reasons``: why the hosts left out are (the
    spares that take their place say it); ``recorded``: called once the run is recorded on the deployment."""
    secrets = _secrets(spec.secrets)
    request = target.backend.jobs.prepare_launch(target.handle, spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    info(f"launching {spec.script} with {spec.launcher} on {target.handle.nodes} nodes of {target.handle.name}"
         f"{' (detached)' if spec.detach else ''}; logs in {run_dir}")
    started = time.monotonic()
    _remember(target, spec)  # before it starts: status, stacks and the hang watchdog's state see it while it runs
    recorded()
    announce(target, request, reasons)  # the nodes on spare hosts, and why
    outcome = target.backend.jobs.launch(target.handle, request, secrets, str(run_dir))
    result = LaunchResult(outcome, spec.run_id, run_dir, round(time.monotonic() - started, 1), attempt=spec.attempt)
    if spec.detach:
        if outcome.exit_code == 0:
            info(f"run {spec.run_id} started in the background: mlenv logs -f follows it, mlenv stop stops it")
        return result
    first = None
    if preempted(outcome):  # not a failure: the loop says so and resumes it
        if outcome.node_exit_codes:
            _summary(result, None)
        return result
    if outcome.failed_node is not None and not outcome.interrupted and outcome.exit_code != IDLE_EXIT_CODE:
        run = target.backend.jobs.latest_run(target.handle, spec.run_id)
        result = replace(result, latest_run=run)
        first = _failed_first(run, outcome, outcome.failed_node)
    if outcome.node_exit_codes and not outcome.interrupted:  # Ctrl-C: one line
        _summary(result, first)
    if outcome.message:
        error(outcome.message)
    if outcome.interrupted:
        error(f"interrupted: every node stopped; logs in {run_dir}")
    elif outcome.exit_code == IDLE_EXIT_CODE:
        error(f"stopped on every node: every GPU of the job was idle (--on-idle stop); logs in {run_dir}")
    elif first is not None:
        node, code, failure = first
        if failure is not None and failure.log_tail:  # the rank's own words, not its launcher's teardown
            error(f"node-{node} failed with exit code {code}; the other nodes were stopped. Rank {failure.rank}"
                  f"{f' ({failure.host})' if failure.host else ''} {failure.reason} first; its last lines "
                  f"(the node's whole log: {result.log(node)}):\n" + "\n".join(failure.log_tail[-TAIL_LINES:]))
        elif (fault := _lost(result.latest_run, node)) is not None:
            error(f"node-{node} was lost ({why_faulty(fault)}); the other nodes were stopped. "
                  f"Last lines of {result.log(node)}:\n{_tail(result.log(node))}")
        else:
            error(f"node-{node} failed with exit code {code}; the other nodes were stopped. "
                  f"Last lines of {result.log(node)}:\n{_tail(result.log(node))}")
    return result


def _lost(run: RunRecord | None, node: int) -> NodeFault | None:
    """``node``'s sign where it was lost to the infrastructure (unreachable, the scheduler lost it)."""
    fault = run.node_faults.get(node) if run is not None else None
    return fault if fault is not None and fault.sign in LOST_SIGNS else None


def _failed_first(run: RunRecord | None, outcome: LaunchOutcome,
                  ended_first: int) -> tuple[int, int, FirstFailure | None]:
    """The node that failed first, its exit code and the rank's first failure: as the nodes' supervisors decided it
    (``run``'s first failure), where the backend keeps their records (the node's launch may have been stopped for a
    peer that ended first with the same failure); else ``ended_first``, the node whose launch ended first with a
    failure (no rank known)."""
    failure = run.first_failure if run is not None else None
    if failure is not None and failure.node in outcome.node_exit_codes:
        return failure.node, failure.exit_code, failure
    lost = [node for node in outcome.node_exit_codes
            if _lost(run, node) is not None]  # a node lost (frozen, cut off) stops the others: it is the cause
    node = lost[0] if lost else ended_first
    return node, outcome.node_exit_codes[node], None


def _remember(target: Target, spec: LaunchSpec) -> None:
    """Record a run on the deployment, so status, logs and stop know of it (attached runs too: another terminal
    may ask while it runs)."""
    if target.recorded is None:
        return
    run = RecordedRun(spec.run_id, spec.script, spec.launcher, spec.detach,
                      datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def added(runs: state.Runs) -> state.Runs:
        counted = [r.preemptions for r in runs if r.id == spec.run_id and r.preemptions is not None]
        return (*runs, replace(run, preemptions=counted[-1] if counted else None))[-KEPT_RUNS:]

    state.update(target.recorded.name, runs=added)


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


def _summary(result: LaunchResult, failed_first: tuple[int, int, FirstFailure | None] | None) -> None:
    """The table of nodes, each node's end in status's words (``succeeded (0)``, ``failed (7)``, ``stopped (143)``:
    exit codes 128+N for a signal N): as its supervisor recorded it where the run was read, else from its exit code
    (a node that did not fail first but ended with an error was stopped for that failure)."""
    outcome = result.outcome
    recorded = result.latest_run.nodes if result.latest_run is not None else {}

    def verdict(node: int) -> NodeEnd:
        code = exit_status(outcome.node_exit_codes.get(node, -1))
        if (end := recorded.get(node)) is not None:
            return end
        if failed_first is not None and node == failed_first[0]:
            return NodeEnd(RunState.FAILED, failed_first[1])
        stopped = node in outcome.stopped or failed_first is not None  # by mlenv: fail-fast, Ctrl-C
        return NodeEnd(exit_state(code, Ending.COLLATERAL if stopped else Ending.OWN), code)

    table(f"launch finished in {result.seconds} s (exit {result.exit_code})",
          ["NODE", "RESULT", "LAST STEP", "LOG"],
          [[f"node-{n}", end_text(verdict(n)), _last_step(result.log(n)), result.log(n)]
           for n in sorted(outcome.node_exit_codes)])


def exit_status(code: int) -> int:
    """A process's exit code as a shell says it: 128+N for one ended by signal N (Popen's -N)."""
    return 128 - code if code < 0 else code
