"""nccl-env on fixture sysfs/proc trees built from real layouts, with the expected variables for each."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mlenv.runtime.fabric.nccl import detect_nccl_env

VF_INFO = json.dumps({
    f"0000:{bus}:00.2": {"generic": {"deviceID": f"0000:{bus}:00.2"},
                         "rdma": {"rdma_char_device": f"/dev/infiniband/uverbs{n}"}}
    for n, bus in zip(range(6, 10), ("1a", "1b", "1c", "1d"), strict=True)
})
POD = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
GPU_POD_WARNINGS = ("RLIMIT_MEMLOCK is 8388608 bytes", "/dev/shm is only 64 MiB")


@dataclass(frozen=True)
class Case:
    """A machine (sysfs + proc fixture), the environment and master, and what nccl-env must say."""

    sysfs: str
    env: dict[str, str]
    warnings: tuple[str, ...] = ()  # one fragment per warning, in order
    proc: str = "pod_rdma"
    master: str | None = "10.128.2.15"
    environ: dict[str, str] = field(default_factory=dict)


CASES = {
    "roce bond: IPv4 RoCE v2 GID at index 7, DMA-BUF without peer memory, GPUs on both sockets": Case(
        "roce_bond",
        {"NCCL_IB_HCA": "=mlx5_bond_0", "NCCL_IB_GID_INDEX": "7", "NCCL_DMABUF_ENABLE": "1",
         "NCCL_NET_GDR_LEVEL": "SYS", **POD},
    ),
    "roce bond with the old toolkit's hard-coded values: kept, GID 3 flagged": Case(
        "roce_bond",
        {"NCCL_DMABUF_ENABLE": "1", "NCCL_NET_GDR_LEVEL": "SYS", **POD},
        ("NCCL_IB_GID_INDEX=3 is not an IPv4 RoCE v2 GID on mlx5_bond_0:1 (IPv4 RoCE v2 indices: mlx5_bond_0:1: 7)",),
        environ={"NCCL_IB_HCA": "mlx5_bond_", "NCCL_IB_GID_INDEX": "3"},
    ),
    "sr-iov: the VFs the device plugin allocated (device-info JSON)": Case(
        "sriov_vfs",
        {"NCCL_IB_HCA": "=mlx5_6,mlx5_7,mlx5_8,mlx5_9", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "PHB",
         "NCCL_SOCKET_IFNAME": "net1", "GLOO_SOCKET_IFNAME": "net1"},
        master="192.168.20.15",
        environ={"PCIDEVICE_OPENSHIFT_IO_MLX5_RDMA_INFO": VF_INFO},
    ),
    "sr-iov: allocation as a plain PCI address list; both VFs on NUMA node 0, GPUs on 0 and 1": Case(
        "sriov_vfs",
        {"NCCL_IB_HCA": "=mlx5_6,mlx5_7", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "SYS", **POD},
        environ={"PCIDEVICE_OPENSHIFT_IO_MLX5_RDMA": "0000:1a:00.2,0000:1b:00.2"},
    ),
    "sr-iov without allocation info: every ACTIVE VF in natural order, PF ports DOWN": Case(
        "sriov_vfs",
        {"NCCL_IB_HCA": "=mlx5_6,mlx5_7,mlx5_8,mlx5_9,mlx5_10,mlx5_11", "NCCL_IB_GID_INDEX": "3",
         "NCCL_NET_GDR_LEVEL": "PHB", **POD},
        ("RDMA ports not ACTIVE, NCCL cannot use them: mlx5_0:1 DOWN, mlx5_1:1 DOWN, mlx5_2:1 DOWN, "
         "mlx5_3:1 DOWN, mlx5_4:1 DOWN, mlx5_5:1 DOWN",),
    ),
    "sr-iov, cluster file asks for TCP (the env contract of tcp mode, mlenv.plan.nccl_env)": Case(
        "sriov_vfs", POD,
        environ={"MLENV_NETWORK_MODE": "tcp", "NCCL_IB_DISABLE": "1"},
    ),
    "sr-iov, cluster file's NCCL variables win": Case(
        "sriov_vfs",
        {"NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "SYS", "GLOO_SOCKET_IFNAME": "eth0"},
        environ={"NCCL_IB_HCA": "=mlx5_6", "NCCL_SOCKET_IFNAME": "net1", "NCCL_IB_DISABLE": "0"},
    ),
    "cluster file names HCAs this pod does not have": Case(
        "sriov_vfs", POD,
        ("NCCL_IB_HCA=mlx5_2,mlx5_3 matches no ACTIVE RDMA device here (ACTIVE: mlx5_6, mlx5_7, mlx5_8, mlx5_9)",),
        environ={"NCCL_IB_HCA": "mlx5_2,mlx5_3", "PCIDEVICE_OPENSHIFT_IO_MLX5_RDMA_INFO": VF_INFO},
    ),
    "infiniband: no GID index, storage RoCE NIC left out, peer memory, default pod limits": Case(
        "infiniband",
        {"NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3", "NCCL_NET_GDR_LEVEL": "PHB", **POD},
        (GPU_POD_WARNINGS[0], "mlx5_3 is on NUMA node 1 but the GPUs are on [0]", GPU_POD_WARNINGS[1]),
        proc="pod_defaults",
    ),
    "infiniband, RDMA disabled by the cluster file": Case(
        "infiniband", POD, ("/dev/shm is only 64 MiB",), proc="pod_defaults", environ={"NCCL_IB_DISABLE": "1"},
    ),
    "no RDMA at all, Slurm node whose NIC towards the master is ens1f1": Case(
        "no_rdma", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ens1f1", "GLOO_SOCKET_IFNAME": "ens1f1"},
        proc="slurm_node", master="192.168.20.15",
    ),
    "no RDMA although the cluster file asks for it": Case(
        "no_rdma", {"NCCL_IB_DISABLE": "1", **POD}, ("the cluster file asks for RDMA but no RDMA port is ACTIVE",),
        environ={"MLENV_NETWORK_MODE": "rdma"},
    ),
    "sparse macvlan GID table: IPv4 RoCE v2 at index 9": Case(
        "macvlan_sparse", {"NCCL_IB_HCA": "=mlx5_2", "NCCL_IB_GID_INDEX": "9", "NCCL_DMABUF_ENABLE": "1",
                           "NCCL_NET_GDR_LEVEL": "PHB", **POD},
    ),
    "two RoCE HCAs disagree on the GID index: left to NCCL": Case(
        "roce_disagree", {"NCCL_IB_HCA": "=mlx5_2,mlx5_3", **POD},
        ("the HCAs disagree on the IPv4 RoCE v2 GID index (mlx5_2:1: 3; mlx5_3:1: 5)",),
    ),
    "GDR: GPU and HCA under one PCIe switch on each socket": Case(
        "gdr_pix", {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_NET_GDR_LEVEL": "PIX", **POD},
    ),
    "GDR: one GPU under the HCA's switch, one under another switch of the same root port": Case(
        "gdr_pxb", {"NCCL_IB_HCA": "=mlx5_0", "NCCL_NET_GDR_LEVEL": "PXB", **POD},
    ),
    "GDR: other root port, other root complex, same NUMA node": Case(
        "gdr_phb", {"NCCL_IB_HCA": "=mlx5_0", "NCCL_NET_GDR_LEVEL": "PHB", **POD},
    ),
    "GDR via DMA-BUF: a GPU on the socket without an HCA": Case(
        "gdr_sys", {"NCCL_IB_HCA": "=mlx5_0", "NCCL_DMABUF_ENABLE": "1", "NCCL_NET_GDR_LEVEL": "SYS", **POD},
    ),
    "GDR: gdr_level auto in the cluster file": Case(
        "gdr_pxb", {"NCCL_IB_HCA": "=mlx5_0", "NCCL_NET_GDR_LEVEL": "PXB", **POD},
        environ={"NCCL_NET_GDR_LEVEL": "auto"},
    ),
    "GDR: the cluster file's level wins": Case(
        "gdr_pxb", {"NCCL_IB_HCA": "=mlx5_0", **POD}, environ={"NCCL_NET_GDR_LEVEL": "SYS"},
    ),
    "no GPUDirect: neither peer memory nor DMA-BUF (proprietary module)": Case(
        "gdr_no_peermem", {"NCCL_IB_HCA": "=mlx5_0", **POD},
        ("no GPUDirect RDMA: no peer memory module (",),
    ),
    "Gloo given an NCCL-style pattern": Case(
        "no_rdma", {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
        ("GLOO_SOCKET_IFNAME=^lo,docker0 is a pattern or a list",), environ={"GLOO_SOCKET_IFNAME": "^lo,docker0"},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_detected_environment(case: Case, fixtures: Path) -> None:
    found = detect_nccl_env(case.environ, sysfs_root=fixtures / "sysfs" / case.sysfs,
                            proc_root=fixtures / "proc" / case.proc, master_addr=case.master)
    assert found.env == case.env
    assert len(found.warnings) == len(case.warnings), found.warnings
    for warning, fragment in zip(found.warnings, case.warnings, strict=True):
        assert fragment in warning


ROUTES = {
    "192.168.20.15": ("slurm_node", "ens1f1", None),  # the subnet of the seed's master-node
    "192.168.20.99": ("slurm_node", "ens1f0np0", None),  # a /32 host route beats the /24
    "10.2.0.5": ("slurm_node", "ib0", None),  # same prefix twice: the lower metric wins
    "172.17.0.5": ("slurm_node", "eno1", None),  # docker0's route is not up: default route
    "8.8.8.8": ("slurm_node", "eno1", None),
    None: ("slurm_node", "eno1", None),  # no master known: the default route
    "127.0.0.1": ("slurm_node", "lo", None),  # two "nodes" on one machine
    "localhost": ("slurm_node", "lo", None),
    "no-such-host.invalid": ("slurm_node", "eno1", "cannot resolve the master address no-such-host.invalid"),
    "10.9.9.9": ("no_route", None, "no route to master 10.9.9.9"),
}


@pytest.mark.parametrize(("master", "proc", "interface", "warning"),
                         [(m, *v) for m, v in ROUTES.items()], ids=[str(m) for m in ROUTES])
def test_socket_interface_routes_to_the_master(
    master: str | None, proc: str, interface: str | None, warning: str | None, fixtures: Path
) -> None:
    found = detect_nccl_env({"NCCL_IB_DISABLE": "1"}, sysfs_root=fixtures / "sysfs" / "no_rdma",
                            proc_root=fixtures / "proc" / proc, master_addr=master)
    assert found.env.get("NCCL_SOCKET_IFNAME") == interface
    assert found.env.get("GLOO_SOCKET_IFNAME") == interface
    assert [warning in w for w in found.warnings] == ([] if warning is None else [True])


def test_explain_names_the_files_and_values(fixtures: Path) -> None:
    sysfs = fixtures / "sysfs" / "roce_bond"
    found = detect_nccl_env({}, sysfs_root=sysfs, proc_root=fixtures / "proc" / "pod_rdma", master_addr="10.128.2.15")
    port = sysfs / "class/infiniband/mlx5_bond_0/ports/1"
    gid_line = next(line for line in found.explain if line.startswith("NCCL_IB_GID_INDEX=7: "))
    assert f"{port}/gids/7 = 0000:0000:0000:0000:0000:ffff:ac12:8003" in gid_line
    assert f"{port}/gid_attrs/types/7 = RoCE v2" in gid_line
    route_line = next(line for line in found.explain if line.startswith("NCCL_SOCKET_IFNAME=eth0: "))
    assert "10.128.2.0/23 dev eth0 metric 0 reaches master 10.128.2.15" in route_line
    assert any("kept from the environment" in line for line in detect_nccl_env(
        {"NCCL_SOCKET_IFNAME": "bond0"}, sysfs_root=sysfs, proc_root=fixtures / "proc" / "pod_rdma").explain)
