"""Node-fault signs: NCCL's own network failure lines (the WARN formats of its source), ECC counts that grew and
Xid events since the start (the nvidia-smi stand-in, a kernel log in /dev/kmsg's format), an in-node check's
refusal; each recorded by a real supervisor run in state.json's first failure (or the node's own node_fault)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from mlenv.runtime.node.gpus import Ecc, Gpu
from mlenv.runtime.records.runlayout import NodeDir, read_state
from mlenv.runtime.records.states import NodeFault
from mlenv.runtime.supervise.launcher import RUNTIME_PARENT, Job, launch, run_job
from mlenv.runtime.watch.faultsigns import (
    NodeFaultWatch,
    gpu_fault,
    nccl_net_error,
)
from runtime_support import FIXTURES

STANDIN = FIXTURES / "nvidia_smi" / "nvidia-smi"
BOOT = 1_764_000_000.0

NET_ERRORS = [  # as NCCL prints them (NCCL_DEBUG=WARN), from bug reports of several versions
    "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> with "
    "error 12, opcode 0, len 0, vendor err 129 (Recv)",
    "ubuntu2:319733:319761 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer "
    "10.153.235.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 "
    "localGid ::ffff:1.1.2.2 remoteGids::ffff:1.1.1.4 hca mlx5_1",
    "gpu7:31:45 [3] NCCL WARN NET/IB : mlx5_2:1 Got async event : port error",
    "gpu7:31:45 [3] NCCL WARN NET/IB : mlx5_0:1 Got async event : local catastrophic error",
    "n1:88:102 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer n2<47556>",
    "n1:88:102 [0] misc/socket.cc:47 NCCL WARN Net : Connection closed by remote peer 10.0.0.2<52418>",
    "n1:88:99 [0] NCCL WARN NET/Socket : socket progress error",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
    "was a network error, NCCL version 2.21.5",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
]
NOT_ERRORS = [
    "n1:88:88 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>",
    "gpu7:31:45 [3] NCCL WARN NET/IB : mlx5_2:1 Got async event : port active",
    "gpu7:31:45 [3] NCCL WARN NET/IB : mlx5_2:1 Got async event : client reregistration",
    "step 10/100 loss 0.5 (network warm-up)",
]


@pytest.mark.parametrize("line", NET_ERRORS)
def test_nccl_s_network_failures_are_a_sign(line: str) -> None:
    assert nccl_net_error(line) == NodeFault("nccl-net", line)


@pytest.mark.parametrize("line", NOT_ERRORS)
def test_other_lines_are_not(line: str) -> None:
    assert nccl_net_error(line) is None


def _gpu(uncorrectable: int | None, retired: int | None = 0, pending: bool | None = False) -> Gpu:
    return Gpu(0, "GPU-aaaa", "NVIDIA H100", "00000000:18:00.0", 90.0, 1.0, 80.0, 50.0, 300.0,
               Ecc(0, uncorrectable, retired, pending))


def test_gpu_signs_are_what_grew_since_the_start() -> None:
    assert gpu_fault([_gpu(0)], [_gpu(0)], []) is None
    assert gpu_fault([_gpu(None)], [_gpu(None)], []) is None  # N/A: nothing to compare
    assert gpu_fault([_gpu(2)], [_gpu(3, retired=1)], []) == NodeFault(
        "ecc", "GPU 0 (00000000:18:00.0): volatile uncorrectable ECC errors 2 -> 3, retired pages 0 -> 1")
    assert gpu_fault([_gpu(0)], [_gpu(0, pending=True)], []) == NodeFault(
        "ecc", "GPU 0 (00000000:18:00.0): a page retirement pending")


def _job(tmp_path: Path, code: str) -> Job:
    """One rank through the wrapper, as torchrun would start it."""
    script = tmp_path / "job.py"
    script.write_text(code)
    launcher = ("import os, subprocess, sys\n"
                "sys.exit(subprocess.call([sys.executable, '-m', 'mlenv.runtime.rank', sys.argv[1]],"
                " env={**os.environ, 'RANK': '0', 'LOCAL_RANK': '0'}))\n")
    return Job([sys.executable, "-c", launcher, str(script)],
               {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": RUNTIME_PARENT}, {}, {})


def _first_failure(tmp_path: Path, code: str, watch: NodeFaultWatch) -> dict[str, object]:
    node_dir = NodeDir(tmp_path / "run", 0, 0)
    assert run_job(_job(tmp_path, code), node_dir=node_dir, observers=[watch]) == 3
    failure = read_state(node_dir)["first_failure"]
    assert isinstance(failure, dict) and failure["rank"] == 0
    return failure


def test_a_failure_after_an_nccl_network_error_carries_it(tmp_path: Path) -> None:
    line = NET_ERRORS[1]
    failure = _first_failure(tmp_path, f"print({line!r}); print('Traceback ...'); raise SystemExit(3)",
                             NodeFaultWatch(nvidia_smi="no-such-nvidia-smi"))
    assert failure["node_fault"] == {"sign": "nccl-net", "evidence": line}


def test_a_plain_failure_carries_no_sign(tmp_path: Path) -> None:
    failure = _first_failure(tmp_path, "raise SystemExit(3)", NodeFaultWatch(nvidia_smi="no-such-nvidia-smi",
                                                                             kmsg=tmp_path / "no-kmsg"))
    assert failure["node_fault"] is None


def _standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uncorrectable: int) -> Path:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps([
        {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:18:00.0",
         "utilization": 97, "memory_used": 71234, "memory_total": 81559, "temperature": 64, "power": 300.0,
         "ecc": {"volatile": {"DRAM Correctable": 0, "DRAM Uncorrectable": uncorrectable}}}]))
    monkeypatch.setenv("NVIDIA_SMI_STANDIN", str(state))
    return state


def test_ecc_errors_that_grew_while_the_job_ran_are_a_sign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _standin(tmp_path, monkeypatch, 0)
    grow = (f"import json; p = {str(state)!r}; g = json.load(open(p)); "
            "g[0]['ecc']['volatile']['DRAM Uncorrectable'] = 2; json.dump(g, open(p, 'w')); raise SystemExit(3)")
    failure = _first_failure(tmp_path, grow, NodeFaultWatch(nvidia_smi=str(STANDIN), kmsg=tmp_path / "no-kmsg"))
    assert failure["node_fault"] == {"sign": "ecc", "evidence": "GPU 0 (00000000:18:00.0): volatile uncorrectable "
                                                                "ECC errors 0 -> 2"}


def test_an_xid_event_since_the_start_is_a_sign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _standin(tmp_path, monkeypatch, 0)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {int(BOOT)}\n")
    kmsg = tmp_path / "kmsg"  # an Xid of before the start, then one the job causes
    kmsg.write_text(f"4,1,{int(1e6)},-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=python3, Graphics Exception\n")
    fall = (f"import time; open({str(kmsg)!r}, 'a').write(f'4,2,{{int((time.time() - {BOOT}) * 1e6)}},-;NVRM: Xid "
            "(PCI:0000:18:00): 79, pid=42, name=python3, GPU has fallen off the bus.\\n'); raise SystemExit(3)")
    failure = _first_failure(tmp_path, fall, NodeFaultWatch(nvidia_smi=str(STANDIN), kmsg=kmsg, proc_root=proc))
    assert failure["node_fault"] == {"sign": "xid", "evidence": "Xid 79 on GPU 0 (0000:18:00): pid=42, "
                                                                "name=python3, GPU has fallen off the bus."}


def test_an_in_node_check_s_refusal_is_the_node_s_sign(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    env = {"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561",
           "MLENV_NETWORK_MODE": "rdma", "MLENV_RESTART_COUNT": "2", "PATH": os.environ["PATH"]}
    assert launch([str(script)], launcher="torchrun", environ=env, nproc=1, run_dir=tmp_path / "run",
                  sysfs_root=FIXTURES / "sysfs/ib_down") == 1
    state = read_state(NodeDir(tmp_path / "run", 2, 1))
    assert (state["state"], state["first_failure"], state["node_fault"]["sign"]) == ("failed", None, "node-check")
    assert state["node_fault"]["evidence"] == state["reason"] and "ACTIVE" in state["reason"]
