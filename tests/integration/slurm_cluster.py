"""A private, real Slurm for the Slurm-backend tests, started once per session by the ``slurm_cluster`` fixture
(again only when a test asks for another number of nodes: a ``slurm_nodes`` fixture of its module's returning 3).

One temporary directory holds everything: a fresh munge key and a ``munged`` on its own socket; ``slurm.conf``,
whose ``AuthInfo=socket=...`` points the daemons and every client at that munged (and holds a requeued job 10 s, not
120); ``gres.conf``; state, spool, pid and log files. ``slurmctld`` and a ``slurmd`` per node (``n1``, ``n2`` and,
when asked, ``n3``...: all ``localhost``, 127.0.0.1, each on its own free port, with 4 CPUs and 2 GPUs) run in the
foreground as children of this process, so the fixture owns their PIDs. Partition ``debug`` (the default, up) holds
every node; partition ``down`` holds them too but is DOWN, so a job sent there stays PENDING with reason
``PartitionDown``. There is no accounting: ``sacct`` does not work, ``scontrol show job`` does (for MinJobAge, 300
s, after the job ends). The GPUs are symlinks to /dev/null: enough for ``--gpus-per-node`` and for
CUDA_VISIBLE_DEVICES in steps.

Use it from a test module with ``pytest_plugins = ["tests.integration.slurm_cluster"]``::

    def test_something(slurm_cluster: SlurmCluster) -> None:
        assert slurm_cluster.ok("srun", "-N2", "-l", "printenv", "SLURMD_NODENAME") == "0: n1\\n1: n2\\n"
        job_id = slurm_cluster.ok("sbatch", "--parsable", "--wrap", "true").strip()
        assert slurm_cluster.wait_finished(job_id)["ExitCode"] == "0:0"

The cluster is shared by the whole session (by the tests that ask for its number of nodes; one private Slurm
runs at a time). After each test, the test's jobs are cancelled and the test fails if any process started for a
job (slurmstepd, a task, a client) outlives them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests._prereq import clean_environ, require
from tests.helpers import free_ports, succeeded, worker_index

DEFAULT_NODES = 2
JOBS_PER_WORKER = 1000  # ten workers' blocks fit in the 10000 job ids after which MASTER_PORT repeats
PARTITIONS = ("debug", "down")
CPUS_PER_NODE = 4
GPUS_PER_NODE = 2
START_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
CLIENTS = ("sinfo", "squeue", "sbatch", "srun", "salloc", "scancel", "scontrol")
DAEMONS = ("munged", "slurmctld", "slurmd")
PACKAGES = ("slurm-wlm", "munge")

SLURM_CONF = """\
ClusterName=mlenv
FirstJobId={first_job_id}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={default_port}
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits until its first credential has expired (default 120 s): 10 s here, so that the tests
# that requeue wait seconds, not minutes (the man page asks only for time enough to start a step)
AuthInfo=socket={tmp}/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool/%n
SlurmctldPidFile={tmp}/run/slurmctld.pid
SlurmdPidFile={tmp}/run/slurmd-%n.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# backfill every second: a batch job starts about 1 s after sbatch (sched/builtin took about 3 s)
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# the nodes have the CPUs configured here, whatever this machine has
SlurmdParameters=config_overrides
ReturnToService=2
# slurmctld listens on 127.0.0.1 only; NoInAddrAny would also make srun bind to what the hostname resolves to
# and fail where it resolves to nothing, so slurmd and srun listen on every address (munge still guards them)
CommunicationParameters=NoCtldInAddrAny
KillWait=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
PartitionName=down Nodes={node_list} MaxTime=INFINITE State=DOWN
"""
NODE_LINE = ("NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=4096 "
             "Gres=gpu:{gpus}")


@dataclass
class SlurmCluster:
    """A private Slurm: its directory, ports (slurmctld's and each node's), the environment its clients need,
    and helpers to drive it."""

    tmp: Path
    ports: dict[str, int]
    nodes: tuple[str, ...]
    startup_s: float = 0.0
    partitions: tuple[str, ...] = PARTITIONS
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def conf_path(self) -> Path:
        return self.tmp / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.tmp / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """What a client adds to its environment to talk to this cluster (auth follows from slurm.conf)."""
        return {"SLURM_CONF": str(self.conf_path)}

    @property
    def logs(self) -> dict[str, Path]:
        """Each daemon's log: munged's output, the Slurm daemons' LogFile (a slurmd's also holds its slurmstepds'
        messages). Next to each Slurm daemon's log, ``NAME.console`` has its own output, early errors included."""
        log = self.tmp / "log"
        return {"munged": log / "munged.log", "slurmctld": log / "slurmctld.log",
                **{f"slurmd-{node}": log / f"slurmd-{node}.log" for node in self.nodes}}

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT, stdin: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; never raises on failure (look at ``returncode``).

        The environment is this process's, without any Slurm or training variables, plus :attr:`env`; the
        working directory (where a job's default ``slurm-%j.out`` lands) is :attr:`tmp` unless given.
        """
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout,
                              env=clean_environ(self.env), cwd=cwd or self.tmp, check=False)

    def ok(self, *argv: str, timeout: float = COMMAND_TIMEOUT) -> str:
        """Run a client command that must succeed; its stdout."""
        return succeeded(self.run(*argv, timeout=timeout)).stdout

    def state(self, job_id: str) -> str:
        """The job's state as squeue shows it (PENDING, RUNNING, COMPLETING...); "" once it has ended (until
        MinJobAge, 300 s, has passed: squeue then fails with "Invalid job id specified")."""
        return self.ok("squeue", "-h", f"--jobs={job_id}", "-o", "%T").strip()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict: JobState, Reason, ExitCode, NodeList, BatchHost, StdOut..."""
        line = self.ok("scontrol", "show", "job", "-o", job_id).strip()
        return dict(re.findall(r"(\S+?)=(.*?)(?= \S+?=|$)", line))

    def wait_running(self, job_id: str, timeout: float = COMMAND_TIMEOUT) -> None:
        self.wait(lambda: self.state(job_id) == "RUNNING", f"job {job_id} to run", timeout)

    def wait_finished(self, job_id: str, timeout: float = 60.0) -> dict[str, str]:
        """Poll squeue until the job has left it, then return its :meth:`job` fields."""
        self.wait(lambda: self.state(job_id) == "", f"job {job_id} to end", timeout)
        return self.job(job_id)

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
        """Poll ``condition`` until it holds; fail at once, with the logs, if a daemon dies, or at ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            dead = {name: p.returncode for name, p in self._daemons.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"Slurm daemon(s) exited {dead} while waiting for {what}\n{self.log_tails()}")
            if condition():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tails()}")
            time.sleep(POLL_INTERVAL)

    def cancel_all(self) -> None:
        """Cancel every job and wait (bounded) until none is pending, running or completing."""
        job_ids = self.ok("squeue", "-h", "-o", "%i").split()
        if job_ids:
            self.ok("scancel", *job_ids)
            self.wait(lambda: not self.ok("squeue", "-h", "-o", "%i").strip(), "cancelled jobs to end")

    def processes(self) -> dict[int, str]:
        """PID -> command line of the processes started for this cluster's jobs: slurmstepd, tasks and clients
        (anything with this cluster's SLURM_CONF in its environment, and their descendants), not the daemons
        and their children."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        parents, marked = _process_table(marker)
        daemons = _descendants(parents, {p.pid for p in self._daemons.values()})
        return {pid: _cmdline(pid) for pid in sorted(_descendants(parents, marked) - daemons - {os.getpid()})}

    def log_tails(self, lines: int = 15) -> str:
        """The last ``lines`` of every log and console file, for error messages."""
        tails = []
        for path in sorted((self.tmp / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(tails)

    def start(self) -> None:
        """Start munged, slurmctld and the slurmds; return once every node is idle."""
        began = time.monotonic()
        self._spawn("munged", [_tool("munged"), "--foreground", f"--socket={self.munge_socket}",
                               f"--key-file={self.tmp / 'munge.key'}", f"--pid-file={self.tmp / 'run/munged.pid'}",
                               f"--seed-file={self.tmp / 'state/munged.seed'}"], self.logs["munged"])
        self.wait(self.munge_socket.exists, "munged to create its socket")
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-f", str(self.conf_path)])
        # A client that finds slurmctld not listening yet retries only a second later: wait for the port first.
        self.wait(lambda: _listening(self.ports["slurmctld"]), "slurmctld to listen")
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", [_tool("slurmd"), "-D", "-N", node, "-f", str(self.conf_path)])
        self.wait(self._all_idle, f"nodes {', '.join(self.nodes)} to be idle")
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons (SIGTERM, then SIGKILL), kill whatever the jobs left behind."""
        controller = self._daemons.get("slurmctld")
        try:
            if controller is not None and controller.poll() is None:
                self.cancel_all()
        finally:
            for process in reversed(self._daemons.values()):
                _terminate(process)
            _kill(list(self.processes()))

    def _spawn(self, name: str, argv: list[str], output: Path | None = None) -> None:
        with (output or self.tmp / "log" / f"{name}.console").open("wb") as console:
            self._daemons[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console,
                                                   stderr=subprocess.STDOUT, env=clean_environ(self.env),
                                                   cwd=self.tmp, start_new_session=True)

    def _all_idle(self) -> bool:
        result = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=5)
        # One line per node and partition.
        return result.returncode == 0 and set(result.stdout.splitlines()) == {f"{n} idle" for n in self.nodes}


def first_job_id() -> int:
    """The first job id of this worker's Slurms: 1, 1001, 2001, ... A job's MASTER_PORT derives from its id
    (``backends/slurm/script.py``), and every worker's Slurm runs its jobs on this machine's one loopback: job 6 of
    two Slurms would listen on the same port."""
    return 1 + JOBS_PER_WORKER * worker_index()


def node_names(count: int) -> tuple[str, ...]:
    """``n1`` ... ``n<count>``."""
    return tuple(f"n{number}" for number in range(1, count + 1))


def create_cluster(count: int = DEFAULT_NODES) -> SlurmCluster:
    """Files of a new cluster of ``count`` nodes in a new directory under /tmp (nothing started).

    /tmp rather than pytest's tmp_path: munged wants execute permission for everyone on every directory above
    its socket (pytest's base directory is 0700), and Unix socket paths must stay under 108 bytes.
    """
    nodes = node_names(count)
    tmp = Path(tempfile.mkdtemp(prefix="mlenv-slurm-", dir="/tmp"))
    tmp.chmod(0o755)
    for sub in ("state", "run", "log", "dev", *(f"spool/{node}" for node in nodes)):
        (tmp / sub).mkdir(parents=True)
    key = os.open(tmp / "munge.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)  # owned by us, munged's user
    with os.fdopen(key, "wb") as out:
        out.write(os.urandom(1024))
    for index in range(GPUS_PER_NODE):
        (tmp / "dev" / f"gpu{index}").symlink_to("/dev/null")  # gres needs character devices
    (tmp / "gres.conf").write_text(f"Name=gpu File={tmp}/dev/gpu[0-{GPUS_PER_NODE - 1}]\n")
    ctld_port, *node_ports = free_ports(1 + len(nodes))
    ports = {"slurmctld": ctld_port, **dict(zip(nodes, node_ports, strict=True))}
    lines = "\n".join(NODE_LINE.format(name=node, port=ports[node], cpus=CPUS_PER_NODE, gpus=GPUS_PER_NODE)
                      for node in nodes)
    (tmp / "slurm.conf").write_text(SLURM_CONF.format(tmp=tmp, ctld_port=ctld_port, default_port=node_ports[0],
                                                      first_job_id=first_job_id(),
                                                      nodes=lines, node_list=",".join(nodes)))
    return SlurmCluster(tmp, ports, nodes=nodes)


@contextmanager
def running_cluster(count: int = DEFAULT_NODES) -> Iterator[SlurmCluster]:
    """A started cluster of ``count`` nodes, stopped and removed afterwards (also when starting it failed)."""
    cluster = create_cluster(count)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(cluster.tmp, ignore_errors=True)


def require_slurm() -> None:
    """Root (SlurmUser=root, jobs as root) and Debian's slurm-wlm and munge, installed with apt-get as root
    when missing. Skip on a workstation, fail under CI=true."""
    if os.geteuid() != 0:
        message = "the private Slurm runs its daemons and jobs as root"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if not all(shutil.which(_tool(name)) for name in (*DAEMONS, *CLIENTS)) and shutil.which("apt-get"):
        _apt_install(*PACKAGES)
    require(*(_tool(name) for name in (*DAEMONS, *CLIENTS)))


class SessionClusters:
    """The session's private Slurm, one at a time: started for the first test that needs it, and again, after
    the previous one has stopped, for a test that asks for another number of nodes."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._cluster: SlurmCluster | None = None

    def get(self, count: int) -> SlurmCluster:
        if self._cluster is None or len(self._cluster.nodes) != count:
            self.close()
            self._cluster = self._stack.enter_context(running_cluster(count))
        return self._cluster

    def close(self) -> None:
        self._cluster = None
        self._stack.close()


@pytest.fixture
def slurm_nodes() -> int:
    """How many nodes the test's private Slurm has: override this fixture in a test module to ask for more."""
    return DEFAULT_NODES


@pytest.fixture(scope="session")
def slurm_clusters() -> Iterator[SessionClusters]:
    """The session's private Slurms (prefer ``slurm_cluster``, which also cleans up after a test)."""
    require_slurm()
    clusters = SessionClusters()
    try:
        yield clusters
    finally:
        clusters.close()


@pytest.fixture
def slurm_cluster(slurm_nodes: int, slurm_clusters: SessionClusters) -> Iterator[SlurmCluster]:
    """The session's private Slurm with ``slurm_nodes`` nodes, with an empty queue; afterwards the test's jobs are
    cancelled, and the test fails if a process started for them is still alive."""
    cluster = slurm_clusters.get(slurm_nodes)
    yield cluster
    cluster.cancel_all()
    try:
        cluster.wait(lambda: not cluster.processes(), "job processes to end", STOP_TIMEOUT)
    except RuntimeError:
        left = cluster.processes()
        _kill(list(left))
        pytest.fail(f"processes of cancelled jobs still alive (now killed): {left}", pytrace=False)


def _tool(name: str) -> str:
    """The absolute path of a Slurm or munge program when found (daemons live in /usr/sbin, maybe off PATH)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin") or name


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)


def _listening(port: int) -> bool:
    """Whether something listens on TCP ``port`` (read from /proc: a probing connection would be logged as an
    error by slurmctld)."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return any(row[1].endswith(f":{port:04X}") and row[3] == "0A" for row in rows)  # 0A: LISTEN


def _process_table(marker: bytes) -> tuple[dict[int, int], set[int]]:
    """Parent of every live process, and the processes whose environment holds ``marker`` (one ``KEY=value``)."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "stat").read_text().rpartition(")")[2].split()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if status[0] != "Z":
            parents[int(entry.name)] = int(status[1])
            if marker in environ:
                marked.add(int(entry.name))
    return parents, marked


def _descendants(parents: dict[int, int], roots: set[int]) -> set[int]:
    """``roots`` (those alive) and every process below them."""
    found = roots & parents.keys()
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return found
        found |= more


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""  # ended meanwhile


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
