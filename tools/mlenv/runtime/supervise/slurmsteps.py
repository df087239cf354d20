"""A Slurm run's attempts, each one srun step, run in its script's place (``python3 -m mlenv.runtime
slurm-attempts``, which the batch job's and the allocation launch's scripts, manifests/slurm/body.sh.j2, exec once
they set the environment up): a failed attempt runs again while the restart policy (records/restartpolicy.py) allows;
a node it leaves out goes to a spare of the allocation, or the run goes on in a batch job without it; after
the scheduler's warning signal the job requeues itself. Every file the attempts leave in the run's directory is
named here (the backend reads them: backends/slurm/)."""

from __future__ import annotations

import argparse
import secrets
import signal
import subprocess  # nosec B404: fixed argv lists, never a shell
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from ..records import restartpolicy
from ..records.attempts import run_attempts
from ..records.restartpolicy import AttemptEnd
from ..records.runlayout import LOST_FILE, write_json
from ..records.states import LeftOut, RunState
from ..watch.faultsigns import scheduler_lost

FAILED_FILE = "failed"
"""In an attempt's directory: ``<node> <exit code>`` of the first node that failed (created once, with noclobber)."""
EXIT_FILE = "exit"
"""In an attempt's directory: the attempt's exit code, written at its end."""
ENDED_FILE = "ended"
"""In an attempt's directory: how the attempt ended (runtime/runlayout.py's ATTEMPT_STATES: the policy's word, or
``stopped``, ``requeued``, ``failed`` where the run was stopped, requeued or could not be requeued)."""
NEXT_FILE = "next"
"""In an attempt's directory: where the run goes on (``job 12 requeued``, ``job 12 restarts the run``, ``batch job 13
submitted, without n2``), written before the attempt's exit file when the restart policy's verdict brings another
attempt; ``mlenv logs -f`` follows the run into it (none: the run ended with the attempt)."""
GRACE_FILE = "grace"
"""In an attempt's directory: why the ranks were stopped when the warning's grace ran out."""
ATTEMPT_FILE = "attempt"
"""In a run directory: the number K of its latest attempt, whose files are in ``attempt-K/``."""
RESUBMITTED_FILE = "resubmitted"
"""In a run directory: ``<job id> <host> <node> saved=<0|1> <why>`` for each batch job that a detached run's script
submitted to go on without a node the restart policy left out (one line each, appended)."""
LEFT_FILE = "left"
"""In a run directory: ``<host> <node> saved=<0|1> <why>`` for each node that a detached run's script inside an
allocation left out (onto a spare, or stopping without one), appended; mlenv records it as excluded where saved=1
when it next looks at the allocation (followed.left_out), then keeps the lines in ``left.read``."""
STOP_FILE = "stop"
"""In a run directory: written by ``mlenv stop`` before it cancels the run's job or step; no further attempt starts,
and the run reads as stopped, never failed."""
PORT_BASE, PORT_SPAN = 20000, 10000
"""MASTER_PORT = PORT_BASE + 2 * (job id % PORT_SPAN): jobs sharing a node (not exclusive) get different ports, and
MASTER_PORT + 1 (the supervisors' control channel) stays free for each."""
STOPPED = 143
"""An attempt's exit code where it was stopped (mlenv stop, scancel, the end of the job)."""
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def master_port(job_id: str) -> int:
    """The rendezvous port of a job."""
    return PORT_BASE + 2 * (int(job_id) % PORT_SPAN)


@dataclass(frozen=True)
class WarningSignal:
    """The scheduler's warning signal (a batch job's slurm.signal): passed to every rank; with ``requeues`` (None:
    the job is not requeued), the ranks get ``grace`` seconds before they are stopped and the job is requeued."""

    name: str
    """As scancel takes it (``USR1``, ``10``)."""
    grace: int
    requeues: int | None
    requeues_by: str
    """What allows the ``requeues`` (the run's --max-restarts, or mlenv's default), as said when none is left."""

    @property
    def number(self) -> signal.Signals:
        return signal.Signals(int(self.name)) if self.name.isdigit() else signal.Signals[f"SIG{self.name}"]


@dataclass(frozen=True)
class Steps:
    """What the attempts are run with."""

    run_dir: Path
    attempt: int
    """The attempt mlenv asked for (one more than the run's latest, where that is higher, runs instead)."""
    max_restarts: int
    srun: tuple[str, ...]
    """One attempt's srun (without --nodelist, which the run's ``nodelist`` adds)."""
    job_nodelist: str
    """The job's nodes (SLURM_JOB_NODELIST), which run the attempts where ``nodelist`` is empty."""
    nodelist: tuple[str, ...] = ()
    """The run's nodes, in node-rank order: the allocation's job nodes, its spares in the place of excluded ones."""
    allocation: tuple[str, ...] = ()
    """The allocation's nodes, in its order (spares included)."""
    exclude: tuple[str, ...] = ()
    script: str | None = None
    """A batch job's script (Slurm keeps it at $0): submitted again to go on without a node left out."""
    export: str = ""
    """The resubmitted job's sbatch --export."""
    warning: WarningSignal | None = None
    secrets: bytes = b""
    """The forwarded secrets, each attempt's stdin (which Slurm hands over and never saves)."""


def _out(argv: Sequence[str]) -> str:
    """What ``argv`` prints, empty where it fails."""
    try:
        said = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,  # nosec B603
                              check=False)
    except OSError:
        return ""
    return said.stdout if said.returncode == 0 else ""


def _say(text: str) -> None:
    print(f"mlenv: {text}", flush=True)


def _exit_code(returncode: int) -> int:
    """A process's exit code as a shell reports it (128 + the signal that ended it)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Attempts:
    """The run's attempts, one at a time; :meth:`run` returns the script's exit code."""

    steps: Steps
    environ: dict[str, str]
    job: str
    nodes: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    count: int = 0
    directory: Path | None = None
    code: int = 0
    warned: bool = False
    handed: str = ""
    requeue: bool = False
    result: int | None = None
    """The script's exit code where the run was stopped."""
    srun: subprocess.Popen[bytes] | None = None
    timer: threading.Timer | None = None

    def run(self) -> int:
        """Every attempt the policy allows; the exit code of the script. The last attempt's exit file is written
        whatever happens (mlenv logs -f ends with it)."""
        try:
            return self._attempts()
        finally:
            if self.directory is not None and not (self.directory / EXIT_FILE).exists():
                self._end("")

    def _attempts(self) -> int:
        for number in ENDING_SIGNALS:
            signal.signal(number, self._ended)
        if self.steps.warning is not None:
            signal.signal(self.steps.warning.number, self._warned)
        self.nodes = list(self.steps.nodelist) or _out(["scontrol", "show", "hostnames",
                                                        self.steps.job_nodelist]).split()
        self.left = list(self.steps.exclude)
        self._master()
        run_attempts(self._start, self._go_on, self.count, self.steps.max_restarts)
        return self.result if self.result is not None else self._last()

    def _start(self, count: int) -> AttemptEnd:
        """Attempt ``count``, unless the run was stopped: its srun step, to its end; how it ended."""
        self.count = count
        if (self.steps.run_dir / STOP_FILE).exists():
            _say(f"run stopped by mlenv stop: attempt {self.count} does not start")
            self.result = STOPPED
            return AttemptEnd(STOPPED, count, final=True)
        directory = self.steps.run_dir / f"attempt-{self.count}"
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        (self.steps.run_dir / ATTEMPT_FILE).write_text(f"{self.count}\n")
        self.code = self._step()
        if (self.steps.run_dir / STOP_FILE).exists():
            _say(f"attempt {self.count} stopped by mlenv stop (exit {self.code})")
            (directory / ENDED_FILE).write_text(f"{RunState.STOPPED.value}\n")
            self.code = self.result = STOPPED
            self._end("")
            return AttemptEnd(STOPPED, count, final=True)
        return self._ended_how()

    def _go_on(self, end: AttemptEnd, verdict: restartpolicy.Verdict | None) -> int | None:
        """The next attempt, where ``verdict`` brings one and a node it leaves out has a spare; None: the run ends
        here (or goes on in a batch job)."""
        if verdict is None or self.result is not None:
            return None
        if verdict.stop is not None:
            _say(verdict.stop)
            return None
        if verdict.left_out and not self._leave_out(verdict.left_out[0]):  # one node left out at a time
            return None
        _say(f"attempt {self.count} failed with exit code {self.code}: restarting the run, attempt "
             f"{self.count + 1} of at most {self.steps.max_restarts} restarts "
             f"(MLENV_RESTART_COUNT={self.count + 1})")
        self._end(f"job {self.job} restarts the run")
        return self.count + 1

    def _master(self) -> None:
        """MASTER_ADDR (the first node, at the address it has there) and MASTER_PORT, for the next attempts."""
        head = self.nodes[0] if self.nodes else ""
        said = _out(["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", head, "hostname", "--ip-address"]).split()
        self.environ.update(MASTER_ADDR=said[0] if said else "", MASTER_PORT=str(master_port(self.job)))
        on = ",".join(self.nodes) if self.steps.nodelist else self.steps.job_nodelist
        _say(f"job {self.job} on {on}, master {head} at {self.environ['MASTER_ADDR']}:{self.environ['MASTER_PORT']}")

    def _step(self) -> int:
        """One attempt: the run's srun, to its end; its exit code."""
        srun = list(self.steps.srun)
        if self.steps.nodelist:
            srun.insert(1, f"--nodelist={','.join(self.nodes)}")
        self.environ["MLENV_RESTART_COUNT"] = str(self.count)
        self.srun = subprocess.Popen(srun, env=self.environ, stdin=subprocess.PIPE)  # nosec B603
        assert self.srun.stdin is not None  # noqa: S101  # stdin=PIPE
        try:
            self.srun.stdin.write(self.steps.secrets)
            self.srun.stdin.close()
        except BrokenPipeError:  # srun ended without reading them
            pass
        code = _exit_code(self.srun.wait())
        if self.timer is not None:
            self.timer.cancel()
        return code

    def _ended_how(self) -> AttemptEnd:
        """How the attempt that ended did, as the restart policy reads it (records/restartpolicy.py ``for_script``):
        the node that failed first (as the nodes' supervisors decided it, else the first task to end with a
        failure), the nodes Slurm lost meanwhile (taken out of the job, which --no-kill keeps running on the others;
        down, failed or drained), and whether the job is requeued."""
        assert self.directory is not None  # noqa: S101  # an attempt ran
        on = ",".join(self.nodes)
        job_nodes = _out(["squeue", "-h", f"--jobs={self.job}", "-t", "running", "-o", "%N"])
        states = _out(["sinfo", "-h", "-N", "-n", on, "-o", "%N|%T|%E"]) if on else ""
        warning = self.steps.warning
        requeues = warning.requeues if warning is not None and warning.requeues is not None else 0
        found = verdict_for(self.steps.run_dir, self.count, self.code, self.nodes, self.directory / FAILED_FILE,
                            self.warned, job_nodes, states, requeues, int(self.environ.get("SLURM_RESTART_COUNT") or 0))
        if found.lost:
            _say(f"lost to the infrastructure in attempt {self.count}: {found.lost}")
        if found.end.node is not None:
            _say(f"node {found.end.node} failed first, with exit code {found.end.exit_code}")
        self.code = found.end.exit_code
        self.requeue = found.requeue
        (self.directory / ENDED_FILE).write_text(f"{found.ended.value}\n")
        return found.end

    def _leave_out(self, left: LeftOut) -> bool:
        """The node ``left`` leaves out of the next attempts: a batch job goes on without it (the run goes on
        there: False), a spare of the allocation takes its place (True), else the run stops (False)."""
        host = self.nodes[left.node] if left.node < len(self.nodes) else f"node-{left.node}"
        if self.steps.script is not None:
            self._resubmit(left, host)
            return False
        with (self.steps.run_dir / LEFT_FILE).open("a") as record:  # mlenv records it as excluded where saved=1
            record.write(f"{host} {left.node} saved={int(left.saved)} {left.reason}\n")
        if not self.steps.nodelist:
            _say(f"{host} (node-{left.node}) must be left out of the run ({left.reason}): not restarting "
                 "it there (the allocation has no spare node: mlenv deploy --spares K holds some)")
            return False
        self.left.append(host)
        _say(f"excluding {host} (node-{left.node}) from the next attempts: {left.reason}")
        spare = next((host for host in self.steps.allocation if host not in self.left and host not in self.nodes),
                     None)
        if spare is None:
            _say(f"no spare node of the allocation is left to take the place of {','.join(self.left)}: stopping")
            return False
        self.nodes = [spare if node == host else node for node in self.nodes]
        self._master()
        return True

    def _resubmit(self, left: LeftOut, host: str) -> None:
        """The batch job that goes on without the node ``left`` (on ``host``) leaves out and the nodes left out
        before: this script, submitted to start once this job has succeeded (it does, having handed the run on; a
        stop of this job cancels it), and recorded in the run's RESUBMITTED_FILE, where mlenv's status, logs, stop
        and clean find it. A stop arriving meanwhile waits until it is recorded."""
        for number in ENDING_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        resubmitted = self.steps.run_dir / RESUBMITTED_FILE
        before = [line.split(" ")[1] for line in _lines(resubmitted) if " " in line]
        excluded = ",".join(sorted({host for host in (*self.steps.exclude, *before, host) if host}))
        _say(f"excluding {host} (node-{left.node}) from the next attempts: {left.reason}")
        try:
            said = subprocess.run(["sbatch", "--parsable", f"--export={self.steps.export}",  # nosec B603 B607
                                   f"--dependency=afterok:{self.job}", "--kill-on-invalid-dep=yes",
                                   f"--exclude={excluded}", str(self.steps.script)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False).stdout
        except OSError as err:
            said = str(err)
        following = said.rstrip("\n").rpartition("\n")[2].partition(";")[0]
        if not following.isdigit():
            _say(f"sbatch refused the run's next attempt, without {excluded}: {said.rstrip()}")
            return
        with resubmitted.open("a") as record:
            record.write(f"{following} {host} {left.node} saved={int(left.saved)} {left.reason}\n")
        self.handed = following
        _say(f"attempt {self.count + 1} of at most {self.steps.max_restarts} restarts submitted as batch job "
             f"{following}, without {excluded} (MLENV_RESTART_COUNT={self.count + 1})")
        self._end(f"batch job {following} submitted, without {excluded}")

    def _last(self) -> int:
        """After the last attempt: the job requeued after the warning, where the policy says so; the exit code."""
        warning = self.steps.warning
        assert self.directory is not None  # noqa: S101  # an attempt ran
        if warning is not None and warning.requeues is not None and self.requeue:
            _say(f"attempt {self.count} ended after the warning (exit {self.code}): requeueing job {self.job}")
            self._end(f"job {self.job} requeued")  # before the requeue, which ends this script
            if subprocess.run(["scontrol", "requeue", self.job], check=False).returncode == 0:  # nosec B603 B607
                return self.code
            _say(f"scontrol requeue {self.job} failed")
            (self.directory / NEXT_FILE).unlink(missing_ok=True)
            return self._failed()
        if warning is not None and warning.requeues is not None and self.warned:
            _say(f"attempt {self.count} ended after the warning (exit {self.code}): not requeueing job {self.job} "
                 f"again: requeued {self.environ.get('SLURM_RESTART_COUNT') or 0} times, the most "
                 f"{warning.requeues_by} allows")
            return self._failed()
        return 0 if self.handed else self.code

    def _failed(self) -> int:
        assert self.directory is not None  # noqa: S101  # an attempt ran
        (self.directory / ENDED_FILE).write_text(f"{RunState.FAILED.value}\n")
        self.code = 1
        (self.directory / EXIT_FILE).write_text("1\n")
        return 1

    def _end(self, following: str) -> None:
        """The attempt's end, once: where the run goes on (``following``, when another attempt comes: in its
        NEXT_FILE, so that mlenv logs -f follows the run into it), then its exit code (mlenv logs -f ends with the
        last attempt's)."""
        assert self.directory is not None  # noqa: S101  # an attempt ran
        if following:
            (self.directory / NEXT_FILE).write_text(f"{following}\n")
        (self.directory / EXIT_FILE).write_text(f"{self.code}\n")

    def _ended(self, number: int, frame: FrameType | None) -> None:
        """A stop of the script (mlenv stop, scancel, the end of the job): the running attempt ends with 143."""
        if self.directory is not None and not (self.directory / EXIT_FILE).exists():
            (self.directory / EXIT_FILE).write_text(f"{STOPPED}\n")
        for process in (self.srun,):
            if process is not None and process.poll() is None:
                process.terminate()
        if self.timer is not None:
            self.timer.cancel()
        sys.exit(STOPPED)

    def _warned(self, number: int, frame: FrameType | None) -> None:
        """The scheduler's warning (it reaches this process alone, B:): passed on to every process of the job's
        steps on every node, where all but the ranks ignore it (the task's trap); where the job is requeued, the
        ranks have the grace to checkpoint before they are stopped."""
        warning = self.steps.warning
        assert warning is not None  # noqa: S101  # the handler of the warning
        self.warned = True
        _say(f"got SIG{warning.name}: passing it to every rank")
        subprocess.run(["scancel", f"--signal={warning.name}", self.job], check=False)  # nosec B603 B607
        if warning.requeues is not None:
            self.timer = threading.Timer(warning.grace, self._grace_over, (warning.grace, self.directory, self.srun))
            self.timer.daemon = True
            self.timer.start()

    @staticmethod
    def _grace_over(grace: int, directory: Path | None, srun: subprocess.Popen[bytes] | None) -> None:
        """The ranks did not end within the grace: they are stopped."""
        said = f"mlenv: the ranks did not end within the grace of {grace} s after the warning: stopping them"
        print(said, flush=True)
        if directory is not None:
            (directory / GRACE_FILE).write_text(f"{said}\n")
        if srun is not None and srun.poll() is None:
            srun.terminate()


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def verdict_for(run_dir: Path, attempt: int, code: int, hosts: Sequence[str], failed_file: Path | None,
                warned: bool, job_nodes: str, node_states: str, requeues: int,
                requeued: int) -> restartpolicy.ScriptEnd:
    """How the restart policy reads (records/restartpolicy.py ``for_script``) attempt ``attempt`` of a Slurm run
    on ``hosts``, the nodes Slurm lost meanwhile (``job_nodes``: squeue's %N of the running job; ``node_states``:
    sinfo's ``%N|%T|%E`` lines of the hosts) among its signs, recorded in the attempt's LOST_FILE."""
    lost = scheduler_lost(hosts, job_nodes, node_states)
    if lost:
        write_json(run_dir / f"attempt-{attempt}" / LOST_FILE,
                   {str(node): fault.to_dict() for node, fault in sorted(lost.items())})
    return restartpolicy.for_script(run_dir, attempt, code, hosts, failed_file, warned, lost, requeues, requeued)


def first_attempt(run_dir: Path, asked: int) -> int:
    """The attempt that runs first: one counter per run, shared by mlenv's restarts, these and Slurm's requeues:
    the one mlenv ``asked`` for, or one more than the run's latest attempt (which these, a requeue or a submission
    that goes on without a node may have started) when that is higher; an attempt's directory is never reused."""
    latest = "".join(_lines(run_dir / ATTEMPT_FILE)).strip()
    return max(asked, int(latest) + 1) if latest.isdigit() else asked


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``slurm-attempts``: the run's attempts, in its script's place; the script's exit code."""
    srun = tuple(args.srun[1:] if args.srun[:1] == ["--"] else args.srun)
    warning = None
    if args.warning:
        warning = WarningSignal(args.warning, args.grace, args.requeues, args.requeues_by)
    steps = Steps(args.run_dir, args.attempt, args.max_restarts, srun, args.job_nodelist,
                  tuple(_split(args.nodelist)), tuple(_split(args.allocation)), tuple(_split(args.exclude)),
                  args.script, args.export, warning, sys.stdin.buffer.read() if args.secrets else b"")
    count = first_attempt(steps.run_dir, steps.attempt)
    job = environ.get("SLURM_JOB_ID", "")
    child = {**environ, "MLENV_RESTART_COUNT": str(count), "MLENV_CONTROL_SECRET": secrets.token_hex(16)}
    return Attempts(steps, child, job, count=count).run()


def _split(text: str) -> list[str]:
    return [word for word in text.split(",") if word]

