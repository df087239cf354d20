"""Run NVIDIA's nccl-tests where the nodes have it (``mlenv nccl-test --tool nccl-tests``): find the binary
(``network.nccl_tests``: ``auto``, ``off`` or the directory holding it) and the command line that runs it across
the nodes, one process per GPU, with the job's NCCL environment.

nccl-tests spans processes, hence nodes, only when built with MPI (``make MPI=1``; NGC images name such binaries
``*_perf_mpi`` or link ``libmpi``). So: under Slurm, ``srun`` starts one task per GPU on every node, with the MPI
plugin the site made the default (MpiDefault: pmix, pmi2; tasks that did not join show as copies of the test side by
side); elsewhere the runtime's launcher runs ``mpirun`` on node 0, one process per GPU of every host. A binary built
without MPI runs as one process driving every GPU of a single node (``-g GPUS``), and cannot span nodes.

``python -m mlenv.runtime.fabric.nccltestsrun ...`` is what runs on the nodes: node 0 starts the command, the others
have nothing to do (srun and mpirun start their processes)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TESTS = ("all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_perf", "reduce_scatter_perf",
         "alltoall_perf", "scatter_perf", "gather_perf", "sendrecv_perf", "hypercube_perf")
SEARCH = ("/usr/local/bin", "/opt/nccl-tests/build", "/opt/nccl-tests/bin", "/opt/nccl_tests/build",
          "/usr/local/nccl-tests/build", "/workspace/nccl-tests/build")
"""Where ``auto`` looks after PATH: NGC PyTorch images and the usual builds."""
NCCL_TESTS_VARIABLE = "MLENV_NCCL_TESTS"
"""network.nccl_tests on the nodes, where the cluster file sets it to other than auto."""
LAUNCHERS = ("srun", "runtime")
"""``srun``: the backend's own launcher starts the processes (Slurm); ``runtime``: mpirun from node 0."""
_MPI_MARK = b"libmpi"
_SCAN = 8 << 20
"""Bytes of a binary searched for the libmpi it links (its dynamic section comes early)."""


@dataclass(frozen=True)
class Tool:
    """An nccl-tests binary on a node."""

    path: str
    mpi: bool
    """Built with MPI: it can span processes and nodes."""


def links_mpi(path: Path) -> bool:
    """Whether the binary at ``path`` is an MPI build: named ``*_mpi`` or linking libmpi."""
    if path.name.endswith("_mpi"):
        return True
    try:
        with path.open("rb") as binary:
            return _MPI_MARK in binary.read(_SCAN)
    except OSError:
        return False


def find_tool(test: str, setting: str, environ: Mapping[str, str]) -> Tool | None:
    """The ``test`` binary (``all_reduce_perf``) as ``setting`` says where to look; an MPI build first; None when
    there is none (or ``setting`` is ``off``)."""
    if setting == "off":
        return None
    places = [setting] if setting != "auto" else [*filter(None, environ.get("PATH", "").split(os.pathsep)), *SEARCH]
    found = [Path(place, name) for place in places for name in (f"{test}_mpi", test)]
    tools = [Tool(str(path), links_mpi(path)) for path in found if path.is_file() and os.access(path, os.X_OK)]
    return next((tool for tool in tools if tool.mpi), tools[0] if tools else None)


def size_args(sizes: Sequence[int]) -> list[str]:
    """nccl-tests' ``-b MIN -e MAX -f FACTOR`` for ``sizes`` (ascending; a factor of 2 unless they say another)."""
    factor = sizes[1] // sizes[0] if len(sizes) > 1 and sizes[0] and sizes[1] % sizes[0] == 0 else 2
    return ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(factor)]


def command(launcher: str, tool: Tool, nodes: int, gpus: int, sizes: Sequence[int], hosts: Sequence[str],
            environ: Mapping[str, str]) -> list[str]:
    """The command line that runs ``tool`` over ``nodes`` x ``gpus`` (``hosts``: the nodes' addresses, node 0
    first); ValueError saying why it cannot (a binary without MPI and several nodes)."""
    test = [tool.path, *size_args(sizes)]
    if not tool.mpi:
        if nodes > 1:
            raise ValueError(f"{tool.path} was built without MPI, so it cannot span nodes; build nccl-tests with "
                             "MPI=1 (or use the image's *_perf_mpi) to test the fabric")
        return [*test, "-g", str(gpus)]
    if launcher == "srun":
        return ["srun", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes * gpus}", f"--ntasks-per-node={gpus}",
                "--kill-on-bad-exit=1", *test, "-g", "1"]
    forwarded = [arg for name in sorted(environ) if name.startswith("NCCL_") for arg in ("-x", name)]
    return ["mpirun", "--allow-run-as-root", "-np", str(nodes * gpus), "-H", ",".join(f"{h}:{gpus}" for h in hosts),
            "--bind-to", "none", *forwarded, *test, "-g", "1"]


def _node_rank(environ: Mapping[str, str]) -> int:
    return int(environ.get("MLENV_NODE_RANK") or environ.get("GROUP_RANK") or environ.get("NODE_RANK") or 0)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """On node 0, run the test and exit as it did; on the other nodes, nothing (srun and mpirun start those)."""
    parser = argparse.ArgumentParser(prog="nccltestsrun", description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", choices=LAUNCHERS, required=True)
    parser.add_argument("--test", choices=TESTS, default="all_reduce_perf")
    parser.add_argument("--setting", default="auto", help="network.nccl_tests: auto, off or a directory")
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated, ascending")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs per node")
    parser.add_argument("--hosts", default="", help="the nodes' addresses, node 0 first, comma-separated")
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    if _node_rank(environ) != 0:
        return 0
    tool = find_tool(args.test, args.setting, environ)
    if tool is None:
        print(f"nccl-tests: no {args.test} on this node ({args.setting})", file=sys.stderr)
        return 2
    try:
        argv_run = command(args.launcher, tool, args.nodes, args.gpus, [int(s) for s in args.sizes.split(",")],
                           [h for h in args.hosts.split(",") if h], environ)
    except ValueError as exc:
        print(f"nccl-tests: {exc}", file=sys.stderr)
        return 2
    if shutil.which(argv_run[0], path=environ.get("PATH")) is None and not Path(argv_run[0]).is_file():
        print(f"nccl-tests: {argv_run[0]} is not on this node's PATH", file=sys.stderr)
        return 2
    print(f"# mlenv: {' '.join(argv_run)}", flush=True)
    return subprocess.run(argv_run, env=dict(environ), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
