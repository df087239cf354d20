"""NCCL_NET_GDR_LEVEL from the PCIe tree: fixture sysfs trees whose devices are links into devices/pci*, as
on a real machine (tests/fixtures/sysfs/gdr_*), and the evidence nccl-env --explain gives for each GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlenv.runtime.fabric.nccl import NcclEnv, detect_nccl_env
from mlenv.runtime.node.pcitopo import distance, pci_device

MASTER = "10.128.2.15"


def detect(fixtures: Path, sysfs: str | Path, proc: str | Path = "pod_rdma", **environ: str) -> NcclEnv:
    """nccl-env's decisions on a fixture tree (an absolute ``proc`` is a tree the test built)."""
    return detect_nccl_env(environ, sysfs_root=fixtures / "sysfs" / sysfs, proc_root=fixtures / "proc" / proc,
                           master_addr=MASTER)


@pytest.mark.parametrize(("sysfs", "evidence"), [
    ("gdr_pix", [
        ("0000:18:00.0", "mlx5_0 (0000:19:00.0)", "PIX", "devices/pci0000:15/0000:15:01.0/0000:16:00.0",
         "same PCIe switch"),
        ("0000:9d:00.0", "mlx5_1 (0000:9e:00.0)", "PIX", "devices/pci0000:9a/0000:9a:01.0/0000:9b:00.0",
         "same PCIe switch"),
    ]),
    ("gdr_pxb", [
        ("0000:05:00.0", "mlx5_0 (0000:06:00.0)", "PIX",
         "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", "same PCIe switch"),
        ("0000:09:00.0", "mlx5_0 (0000:06:00.0)", "PXB", "devices/pci0000:00/0000:00:01.0/0000:01:00.0",
         "different PCIe switches below root port 0000:00:01.0"),
    ]),
    ("gdr_phb", [
        ("0000:03:00.0", "mlx5_0 (0000:01:00.0)", "PHB", "devices/pci0000:00",
         "different root ports of pci0000:00, through its host bridge"),
        ("0000:21:00.0", "mlx5_0 (0000:01:00.0)", "PHB", "devices",
         "different root complexes pci0000:20 and pci0000:00, both on NUMA node 0"),
    ]),
    ("gdr_sys", [
        ("0000:18:00.0", "mlx5_0 (0000:19:00.0)", "PIX", "devices/pci0000:15/0000:15:01.0/0000:16:00.0",
         "same PCIe switch"),
        ("0000:9d:00.0", "mlx5_0 (0000:19:00.0)", "SYS", "devices",
         "different root complexes pci0000:9a and pci0000:15, NUMA nodes 1 and 0"),
    ]),
])
def test_explain_names_gpu_hca_common_ancestor_and_level(
    sysfs: str, evidence: list[tuple[str, str, str, str, str]], fixtures: Path
) -> None:
    found = detect(fixtures, sysfs)
    root = fixtures / "sysfs" / sysfs
    expected = [f"GPU {gpu} -> {hca}: {level}, common ancestor {root / ancestor} ({reason})"
                for gpu, hca, level, ancestor, reason in evidence]
    assert [line for line in found.explain if line.startswith("GPU ")] == expected
    farthest = max(evidence, key=lambda e: ["PIX", "PXB", "PHB", "SYS"].index(e[2]))
    (decision,) = [line for line in found.explain if line.startswith("NCCL_NET_GDR_LEVEL=")]
    assert decision.startswith(f"NCCL_NET_GDR_LEVEL={farthest[2]}: ")
    assert decision.endswith(f"covers every GPU's nearest HCA (farthest: GPU {farthest[0]} -> {farthest[1]})")


def test_peer_memory_or_dma_buf_is_the_evidence(fixtures: Path) -> None:
    (peer,) = [line for line in detect(fixtures, "gdr_pix").explain if line.startswith("NCCL_NET_GDR_LEVEL=")]
    assert f"{fixtures / 'sysfs/gdr_pix/kernel/mm/memory_peers/nv_mem'} exists (GPUDirect peer memory)" in peer
    dmabuf = detect(fixtures, "gdr_sys")
    assert dmabuf.env["NCCL_DMABUF_ENABLE"] == "1"
    (level,) = [line for line in dmabuf.explain if line.startswith("NCCL_NET_GDR_LEVEL=")]
    assert f"DMA-BUF ({fixtures / 'sysfs/gdr_sys/module/nvidia/taint'} = OE: NVIDIA's open kernel module)" in level


def test_without_gpudirect_the_level_is_not_set(fixtures: Path) -> None:
    found = detect(fixtures, "gdr_no_peermem")
    assert "NCCL_NET_GDR_LEVEL" not in found.env and "NCCL_DMABUF_ENABLE" not in found.env
    (warning,) = found.warnings
    assert f"{fixtures / 'sysfs/gdr_no_peermem/module/nvidia/taint'} = POE: the proprietary nvidia kernel module" in (
        warning)
    assert warning.endswith("NCCL will stage GPU buffers in host memory, NCCL_NET_GDR_LEVEL not set")
    assert f"warning: {warning}" in found.explain
    assert not any(line.startswith("GPU ") for line in found.explain)


def test_auto_is_replaced_or_removed(fixtures: Path) -> None:
    detected = detect(fixtures, "gdr_phb", NCCL_NET_GDR_LEVEL="auto")
    assert (detected.env["NCCL_NET_GDR_LEVEL"], detected.unset) == ("PHB", [])
    undecided = detect(fixtures, "gdr_no_peermem", NCCL_NET_GDR_LEVEL="auto")
    assert ("NCCL_NET_GDR_LEVEL" in undecided.env, undecided.unset) == (False, ["NCCL_NET_GDR_LEVEL"])
    assert "NCCL_NET_GDR_LEVEL=auto: nothing detected, removed so that NCCL uses its own default" in undecided.explain
    kept = detect(fixtures, "gdr_phb", NCCL_NET_GDR_LEVEL="PIX")
    assert "NCCL_NET_GDR_LEVEL" not in kept.env and kept.unset == []
    assert "NCCL_NET_GDR_LEVEL=PIX: kept from the environment (detection says PHB)" in kept.explain


def test_only_the_containers_own_gpus_count(fixtures: Path, tmp_path: Path) -> None:
    """sysfs shows every GPU of the host; the NVIDIA container runtime shows a container only its own in
    /proc/driver/nvidia/gpus. A pod with just the GPU under mlx5_0's switch needs PIX, not SYS."""
    proc = tmp_path / "proc"
    shutil.copytree(fixtures / "proc" / "pod_rdma", proc)
    (proc / "driver/nvidia/gpus/0000:18:00.0").mkdir(parents=True)
    found = detect(fixtures, "gdr_sys", proc)
    assert found.env["NCCL_NET_GDR_LEVEL"] == "PIX"
    (pair,) = [line for line in found.explain if line.startswith("GPU ")]
    assert pair.startswith("GPU 0000:18:00.0 -> mlx5_0 (0000:19:00.0): PIX")


def test_dma_buf_needs_linux_5_12(fixtures: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(fixtures / "proc" / "pod_rdma", proc)
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/osrelease").write_text("5.4.0-150-generic\n")
    (warning,) = detect(fixtures, "gdr_sys", proc).warnings
    assert f"{proc / 'sys/kernel/osrelease'} = 5.4.0-150-generic: DMA-BUF for RDMA needs Linux 5.12 or later" in warning
    (proc / "sys/kernel/osrelease").write_text("5.14.0-427.13.1.el9_4.x86_64\n")
    assert detect(fixtures, "gdr_sys", proc).env["NCCL_NET_GDR_LEVEL"] == "SYS"


def test_nv_peer_mem_counts_as_peer_memory(fixtures: Path, tmp_path: Path) -> None:
    sysfs = tmp_path / "sysfs"
    shutil.copytree(fixtures / "sysfs" / "gdr_no_peermem", sysfs, symlinks=True)
    (sysfs / "module/nv_peer_mem").mkdir()
    found = detect_nccl_env({}, sysfs_root=sysfs, proc_root=fixtures / "proc/pod_rdma", master_addr=MASTER)
    assert (found.env["NCCL_NET_GDR_LEVEL"], found.warnings) == ("PIX", [])


def test_without_pci_links_the_numa_nodes_bound_the_distance(fixtures: Path) -> None:
    """Older trees (no links into devices/): same NUMA node is at most PHB, another one SYS."""
    sysfs = fixtures / "sysfs" / "roce_bond"
    gpus = {address: pci_device(address, sysfs / "bus/pci/drivers/nvidia" / address, sysfs)
            for address in ("0000:18:00.0", "0000:3a:00.0")}
    bond = pci_device("mlx5_bond_0", sysfs / "class/infiniband/mlx5_bond_0/device", sysfs)
    assert (gpus["0000:18:00.0"].tree, bond.tree, bond.numa_node) == (None, None, 0)
    near, far = (distance(gpus[a], bond, sysfs) for a in ("0000:18:00.0", "0000:3a:00.0"))
    assert (near.level, near.ancestor, far.level) == ("PHB", None, "SYS")
    assert near.describe() == (f"GPU 0000:18:00.0 -> mlx5_bond_0: PHB, no common ancestor known "
                               f"({sysfs}/bus/pci/drivers/nvidia/0000:18:00.0 is not a link into {sysfs}/devices, "
                               "both on NUMA node 0)")


def test_unknown_numa_node_counts_as_far(tmp_path: Path) -> None:
    for name in ("gpu", "nic"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "numa_node").write_text("-1\n")
    gpu, nic = (pci_device(name, tmp_path / name, tmp_path) for name in ("gpu", "nic"))
    assert distance(gpu, nic, tmp_path).level == "SYS"


def test_hyper_v_guests_have_their_root_complexes_below_vmbus(tmp_path: Path) -> None:
    """Azure GPU VMs: every passed-through device on a PCI bus of its own below the VMBus device."""
    vmbus = Path("devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00")
    devices = {}
    for name, guid, domain, node in (("gpu", "00000001-0001-0000-3130-444531303244", "0001", "0"),
                                     ("nic", "00000101-0001-0000-3130-444531303244", "0101", "0"),
                                     ("far", "00000102-0001-0000-3130-444531303244", "0102", "1")):
        device = tmp_path / vmbus / guid / f"pci{domain}:00" / f"{domain}:00:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node}\n")
        link = tmp_path / "bus/pci/devices" / device.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../..", device.relative_to(tmp_path)))
        devices[name] = pci_device(device.name, link, tmp_path)
    near = distance(devices["gpu"], devices["nic"], tmp_path)
    assert (near.level, near.ancestor) == ("PHB", tmp_path / vmbus)
    assert near.reason == "different root complexes pci0001:00 and pci0101:00, both on NUMA node 0"
    assert distance(devices["gpu"], devices["far"], tmp_path).level == "SYS"
