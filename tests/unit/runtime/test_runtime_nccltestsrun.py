"""Running NVIDIA nccl-tests (runtime/fabric/nccltestsrun.py): where the binary is found, whether it is an MPI
build, and the golden command line every backend gets (its own task launcher, else the runtime's mpirun)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mlenv.core.registry import BACKENDS
from mlenv.runtime.fabric.nccltestsrun import Tool, command, find_tool, links_mpi, main, size_args

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
ENV = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "ens1f0", "PATH": "/usr/bin", "HOME": "/root"}
MPI = Tool("/opt/nccl-tests/build/all_reduce_perf_mpi", mpi=True)
GOLDEN = {
    "srun": "srun --overlap --nodes=2 --ntasks=8 --ntasks-per-node=4 --kill-on-bad-exit=1 "
            "/opt/nccl-tests/build/all_reduce_perf_mpi -b 1048576 -e 1073741824 -f 4 -g 1",
    "runtime": "mpirun --allow-run-as-root -np 8 -H node-a:4,node-b:4 --bind-to none -x NCCL_IB_HCA "
               "-x NCCL_SOCKET_IFNAME /opt/nccl-tests/build/all_reduce_perf_mpi -b 1048576 -e 1073741824 -f 4 -g 1",
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_gets_its_golden_command_line(backend: str) -> None:
    launcher = BACKENDS[backend].task_launcher or "runtime"
    assert launcher == ("srun" if backend == "slurm" else "runtime")
    argv = command(launcher, MPI, nodes=2, gpus=4, sizes=SIZES, hosts=["node-a", "node-b"], environ=ENV)
    assert shlex.join(argv) == GOLDEN[launcher]


def test_a_build_without_mpi_runs_one_node_and_refuses_several() -> None:
    plain = Tool("/usr/local/bin/all_reduce_perf", mpi=False)
    for launcher in ("srun", "runtime"):
        assert command(launcher, plain, 1, 8, SIZES, ["node-a"], ENV) == [
            "/usr/local/bin/all_reduce_perf", "-b", "1048576", "-e", "1073741824", "-f", "4", "-g", "8"]
        with pytest.raises(ValueError, match="built without MPI, so it cannot span nodes"):
            command(launcher, plain, 2, 8, SIZES, ["node-a", "node-b"], ENV)


def test_size_arguments() -> None:
    assert size_args([8 << 20, 16 << 20, 32 << 20]) == ["-b", "8388608", "-e", "33554432", "-f", "2"]
    assert size_args([1 << 20]) == ["-b", "1048576", "-e", "1048576", "-f", "2"]


def _binary(directory: Path, name: str, text: bytes = b"#!/bin/sh\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_auto_finds_it_on_path_an_mpi_build_first_off_never(tmp_path: Path) -> None:
    plain = _binary(tmp_path / "bin", "all_reduce_perf")
    environ = {"PATH": str(tmp_path / "bin")}
    assert find_tool("all_reduce_perf", "auto", environ) == Tool(str(plain), mpi=False)
    linked = _binary(tmp_path / "mpi", "all_reduce_perf", b"\x7fELF...libmpi.so.40\x00...")
    assert links_mpi(linked)
    environ = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{tmp_path / 'mpi'}"}
    assert find_tool("all_reduce_perf", "auto", environ) == Tool(str(linked), mpi=True)
    assert find_tool("all_reduce_perf", "off", environ) is None
    suffixed = _binary(tmp_path / "build", "all_gather_perf_mpi")
    assert find_tool("all_gather_perf", str(tmp_path / "build"), {}) == Tool(str(suffixed), mpi=True)
    assert find_tool("all_reduce_perf", str(tmp_path / "build"), environ) is None
    (tmp_path / "bin" / "all_reduce_perf").chmod(0o644)
    assert find_tool("all_reduce_perf", str(tmp_path / "bin"), {}) is None  # not executable


FAKE_TEST = """#!/bin/sh
echo "# nThread 1 nGpus $8 minBytes $2 maxBytes $4 step: $6(factor) warmup iters: 5 iters: 20 validation: 1"
echo "#  Rank  0 Group  0 Pid   $$ on $(hostname) device  0 [0x01] Fake GPU"
echo "#   size    count   type  redop  root   time  algbw  busbw  #wrong   time  algbw  busbw  #wrong"
echo "     $4  $(($4 / 4))  float    sum    -1  100.0  10.00   0.00       0  100.0  10.00   0.00       0"
echo "# Out of bounds values : 0 OK"
echo "# Avg bus bandwidth    : 0"
"""


def test_the_runner_runs_on_node_0_only_and_says_what_it_runs(tmp_path: Path) -> None:
    _binary(tmp_path / "bin", "all_reduce_perf", FAKE_TEST.encode())
    environ = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "MLENV_NODE_RANK": "0"}
    args = ["--launcher", "runtime", "--sizes", "1048576,4194304", "--nodes", "1", "--gpus", "2", "--hosts", "n0"]
    code = f"import sys; from mlenv.runtime.fabric.nccltestsrun import main; sys.exit(main({args!r}))"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **environ},
                         check=False, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == f"# mlenv: {tmp_path / 'bin' / 'all_reduce_perf'} -b 1048576 -e 4194304 " \
                                         "-f 4 -g 2"
    assert "# Avg bus bandwidth" in ran.stdout
    assert main(args, {**environ, "MLENV_NODE_RANK": "1"}) == 0  # srun and mpirun start the other nodes' share
    assert main([*args[:-4], "--nodes", "2", "--gpus", "2"], environ) == 2  # no MPI: one node only
    assert main(args, {"PATH": str(tmp_path / "nowhere"), "MLENV_NODE_RANK": "0"}) == 2
