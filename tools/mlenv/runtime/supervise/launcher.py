"""Start the job on this node: torchrun with a static rendezvous, or DeepSpeed's launcher without ssh; either way
node N runs global ranks N*k ... N*k+k-1 (k processes per node) in every attempt, so that a rank finds its own
checkpoint again on its node's storage.

Run the same command on every node. Each rank runs through ``mlenv.runtime.rank`` under this node's supervisor
(supervisor.py): its lines go, whole and tagged, to stdout and, with a run directory, to
``<run_dir>/attempt-<K>/node<R>/output.log``; the first failing rank's exit status becomes ours. In rdma mode a
node without a usable RDMA network is refused before the job starts (preflight.py); the transport observer
(transportproof.py) proves from NCCL's lines, while the job runs, that it uses the expected transport.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..fabric.nccl import NcclEnv, detect_nccl_env
from ..fabric.preflight import library_dirs, rdma_preflight
from ..forensics import collectives
from ..forensics.flightrecorder import flight_recorder_env, torch_version
from ..forensics.stacks import FAULTHANDLER_DIR
from ..node.host import visible_gpu_count
from ..node.topology import DEFAULT_APP_NAME, Topology, detect_topology, host_name
from ..records.runlayout import NodeDir, attempt_of, write_json
from ..records.states import FaultSign, NodeFault, RunState
from ..watch.protocol import Observer
from ..watch.transportproof import Expectation, debug_env, expectation
from .control import SILENCE_SECONDS
from .rankoutput import Sinks
from .supervisor import Supervisor
from .tempdirs import held_tempdir
from .usersignals import handling_user_signals

RANK_MODULE = "mlenv.runtime.rank"
"""What torchrun and DeepSpeed start for each rank (``-m``/``--module``): the wrapper that runs the script."""
RUNTIME_PARENT = str(Path(__file__).resolve().parents[3])
"""The directory holding the ``mlenv`` package, on the workers' PYTHONPATH so that they find the wrapper."""
SITE_DIR = str(Path(__file__).resolve().parents[1] / "site")
"""First on the workers' PYTHONPATH: its sitecustomize arms faulthandler, then runs the image's own."""
CONTROL_PORT_OFFSET = 1
"""Node 0's supervisor listens for the others on MASTER_PORT + 1."""
CONTAINER_LOG_VARIABLE = "MLENV_CONTAINER_LOG"
"""Set by the rendered StatefulSet: where the container's own stdout can be opened (e.g. /proc/1/fd/1)."""


@dataclass(frozen=True)
class Job:
    """One node's share of a launch: the command to run and its environment."""

    argv: list[str]
    env: dict[str, str]
    added_env: dict[str, str]  # what mlenv added to the inherited environment
    files: dict[Path, str]  # written before the job starts (DeepSpeed's hostfile)


def torchrun_argv(
    topology: Topology, nproc: int, command: list[str], *, rdzv_id: str, local_addr: str | None
) -> list[str]:
    """torchrun with a static rendezvous at the master, which node 0 hosts: this node's rank is the topology's
    (``--node-rank``), not its place in a join order as with c10d, so its global ranks are the same in every attempt;
    every worker runs through the rank wrapper."""
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(topology.num_nodes),
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", f"{_host_for_url(topology.master_addr)}:{topology.master_port}",
        "--rdzv-id", rdzv_id,
        "--node-rank", str(topology.node_rank),
        "--max-restarts", "0",
    ]  # fmt: skip
    if local_addr:
        argv += ["--local-addr", local_addr]
    return [*argv, "-m", RANK_MODULE, *command]


def deepspeed_argv(topology: Topology, nproc: int, command: list[str], *, hostfile: Path) -> list[str]:
    """DeepSpeed's runner in no-ssh mode: each node starts its own processes, each through the rank wrapper."""
    return [
        sys.executable, "-m", "deepspeed.launcher.runner",
        "--no_ssh",
        "--node_rank", str(topology.node_rank),
        "--num_nodes", str(topology.num_nodes),
        "--num_gpus", str(nproc),
        "--master_addr", topology.master_addr,
        "--master_port", str(topology.master_port),
        "--hostfile", str(hostfile),
        "--module", RANK_MODULE,
        *command,
    ]  # fmt: skip


def hostfile_text(num_nodes: int, nproc: int) -> str:
    """An MPI-style hostfile; with ``--no_ssh`` DeepSpeed only reads the node count and slots."""
    return "".join(f"node-{i} slots={nproc}\n" for i in range(num_nodes))


def rendezvous_id(environ: Mapping[str, str], topology: Topology) -> str:
    """The same id on every node: ``MLENV_RUN_ID``, else derived from app name and master endpoint."""
    if environ.get("MLENV_RUN_ID"):
        return environ["MLENV_RUN_ID"]
    app = environ.get("MLENV_APP_NAME") or DEFAULT_APP_NAME
    endpoint = f"{topology.master_addr}:{topology.master_port}".encode()
    return f"{app}-{zlib.crc32(endpoint):08x}"


def local_address(master_addr: str, master_port: int) -> str | None:
    """This node's address towards the master, as the kernel routes it (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, master_port))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def default_nproc(topology: Topology, environ: Mapping[str, str], proc_root: str | Path) -> int:
    """Processes per node: the topology's, else one per visible GPU, else 1 (CPU)."""
    return topology.procs_per_node or visible_gpu_count(environ, proc_root) or 1


def _host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def launch(
    command: list[str],
    *,
    launcher: str,
    environ: Mapping[str, str],
    nproc: int | None = None,
    run_dir: Path | None = None,
    sysfs_root: str | Path = "/sys",
    proc_root: str | Path = "/proc",
    dry_run: bool = False,
    node_log: bool = True,
    expect_transport: str | None = None,
    observers: Sequence[Observer] = (),
    node_silence: float | None = None,
) -> int:
    """Configure NCCL, start the job through ``launcher`` under this node's supervisor and return its exit status
    (the first failing rank's own code); with a ``run_dir``, this node's records go to
    ``<run_dir>/attempt-<K>/node<R>/`` and its output to ``output.log`` there unless ``node_log`` is off
    (stdout already is that file); ``node_silence``: how long another node may stay silent before it is lost
    (default control.SILENCE_SECONDS)."""
    topology = detect_topology(environ)
    nproc = nproc or default_nproc(topology, environ, proc_root)
    nccl = detect_nccl_env(
        environ, sysfs_root=sysfs_root, proc_root=proc_root, master_addr=topology.master_addr
    )
    for warning in nccl.warnings:
        _note(f"warning: {warning}")
    expected = expectation(expect_transport, environ)
    if not dry_run and environ.get("MLENV_NETWORK_MODE") == "rdma" and expected.expect != "any":
        check = rdma_preflight(environ, sysfs_root=sysfs_root, lib_dirs=library_dirs(environ))
        for line in [*check.notes, *(f"warning: {w}" for w in check.warnings)]:
            _note(line)
        if check.refusal:
            _note(f"error: {check.refusal}; not starting the job (--expect-transport any starts it anyway)")
            if run_dir is not None:
                _refused(NodeDir(run_dir, attempt_of(environ), topology.node_rank), check.refusal)
            return 1
    with ExitStack() as stack:
        workdir = run_dir or stack.enter_context(held_tempdir("mlenv-launch-"))
        node_dir = NodeDir(workdir, attempt_of(environ), topology.node_rank)
        job = _prepare(command, launcher, topology, nproc, environ, nccl, node_dir.path, expected,
                       node_dir.path if run_dir else None)
        _note(f"node {topology.node_rank}/{topology.num_nodes} ({topology.source}), {nproc} processes, "
              f"master {topology.master_addr}:{topology.master_port}")
        removed = [f"unset {name}" for name in nccl.unset]
        assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(job.added_env.items())]
        if dry_run:
            print("\n".join([*removed, *assignments, shlex.join(job.argv)]))
            return 0
        _note("env " + " ".join([*(f"-u {name}" for name in nccl.unset), *assignments]))
        _note("exec " + shlex.join(job.argv))
        node_dir.path.mkdir(parents=True, exist_ok=True)
        for path, text in job.files.items():
            path.write_text(text)
        log = node_dir.log if run_dir and node_log else None
        control = (topology.master_addr, topology.master_port + CONTROL_PORT_OFFSET)
        return run_job(job, log, node_dir=node_dir, host=host_name(environ), num_nodes=topology.num_nodes,
                       control=control, observers=observers, silence=node_silence)


def _refused(node_dir: NodeDir, refusal: str) -> None:
    """Record that an in-node check refused to start this node's share: a node-fault sign (faultsigns.py)."""
    node_dir.path.mkdir(parents=True, exist_ok=True)
    write_json(node_dir.state, {"state": RunState.FAILED, "reason": refusal, "first_failure": None,
                                "node_fault": NodeFault(FaultSign.NODE_CHECK, refusal).to_dict()})


def _prepare(
    command: list[str],
    launcher: str,
    topology: Topology,
    nproc: int,
    environ: Mapping[str, str],
    nccl: NcclEnv,
    workdir: Path,
    expected: Expectation,
    dump_dir: Path | None = None,
) -> Job:
    """The argv, environment and files for this node; with ``dump_dir`` (the node's directory of the run) the
    ranks' NCCL flight recorder dumps and faulthandler files go there."""
    added = {**nccl.env, **debug_env(expected, environ),  # the transport proof reads NCCL's INFO lines
             **flight_recorder_env(environ, dump_dir, torch_version())}
    if "PYTHONUNBUFFERED" not in environ:
        added["PYTHONUNBUFFERED"] = "1"  # progress lines through the pipe as they happen
    files = {}
    if launcher == "torchrun":
        argv = torchrun_argv(
            topology, nproc, command,
            rdzv_id=rendezvous_id(environ, topology),
            local_addr=local_address(topology.master_addr, topology.master_port),
        )  # fmt: skip
    else:
        hostfile = workdir / f"hostfile.node{topology.node_rank}"
        files[hostfile] = hostfile_text(topology.num_nodes, nproc)
        argv = deepspeed_argv(topology, nproc, command, hostfile=hostfile)
    inherited = {name: value for name, value in environ.items() if name not in nccl.unset}
    env = {**inherited, **added}
    if dump_dir is not None:  # faulthandler armed in every rank: mlenv stacks without ptrace rights
        env[FAULTHANDLER_DIR] = str(dump_dir / "stacks" / "faulthandler")
        if collectives.enabled(environ):  # each rank's collective progress: mlenv stacks names who is behind
            env[collectives.DIRECTORY_ENV] = str(dump_dir / "stacks" / "collectives")
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, RUNTIME_PARENT, *filter(None, [environ.get("PYTHONPATH")])])
    return Job(argv, env, added, files)


def run_job(
    job: Job,
    log_path: Path | None = None,
    *,
    node_dir: NodeDir,
    host: str = "localhost",
    num_nodes: int = 1,
    control: tuple[str, int] | None = None,
    observers: Sequence[Observer] = (),
    silence: float | None = None,
) -> int:
    """Run the job under this node's supervisor, its tagged lines copied to stdout, the node log and, in a pod,
    the container's own log (``MLENV_CONTAINER_LOG``, e.g. /proc/1/fd/1, so ``kubectl logs -f`` follows
    training)."""
    with ExitStack() as stack:
        sinks: list[IO[bytes]] = [stack.enter_context(log_path.open("ab"))] if log_path else []
        sinks += _container_log(stack, job.env.get(CONTAINER_LOG_VARIABLE))
        supervisor = Supervisor(job.argv, job.env, node_dir.node, num_nodes, host, node_dir, observers,
                                Sinks(sinks), control_address=control, silence=silence or SILENCE_SECONDS)
        return supervisor.run()


@contextmanager
def forwarding_signals(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass SIGINT/SIGTERM/SIGHUP on to ``process`` (which, when it also gets one through our process group,
    counts it once)."""
    def forward(signum: int, _frame: object) -> None:
        with suppress(ProcessLookupError):
            process.send_signal(signum)

    with handling_user_signals(forward):
        yield


def _container_log(stack: ExitStack, path: str | None) -> list[IO[bytes]]:
    """The container's log opened for appending, when the pod names one and it can be written."""
    if not path:
        return []
    try:
        return [stack.enter_context(open(path, "ab"))]
    except OSError as exc:
        _note(f"not copying output to the container log {path}: {exc.strerror}")
        return []


def _note(message: str) -> None:
    print(f"mlenv: {message}", file=sys.stderr, flush=True)
