"""rdma mode refuses to start blind: sysfs fixture trees for verbs fabrics, library folders for plugin fabrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlenv.runtime.fabric.preflight import library_dirs, rdma_preflight


def test_an_active_port_lets_the_job_start(fixtures: Path) -> None:
    check = rdma_preflight({}, sysfs_root=fixtures / "sysfs/infiniband", lib_dirs=[])
    assert check.refusal is None and check.warnings == []
    assert check.notes[0].startswith("RDMA ports ACTIVE: mlx5_0:1")


def test_no_active_port_on_a_verbs_fabric_refuses_with_the_evidence(fixtures: Path) -> None:
    sysfs = fixtures / "sysfs/ib_down"
    check = rdma_preflight({"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}, sysfs_root=sysfs, lib_dirs=[])
    assert check.refusal == (
        "rdma mode, but no RDMA port is ACTIVE on this node, so NCCL would fall back to sockets "
        f"({sysfs}/class/infiniband/mlx5_0/ports/1/state: DOWN; {sysfs}/class/infiniband/mlx5_1/ports/1/state: DOWN)")


def test_hcas_the_file_names_must_exist(fixtures: Path) -> None:
    check = rdma_preflight({"NCCL_IB_HCA": "=mlx5_9"}, sysfs_root=fixtures / "sysfs/infiniband", lib_dirs=[])
    assert check.refusal is not None
    assert check.refusal.startswith("rdma mode, but no RDMA device here matches =mlx5_9 (present in")


def test_only_the_allocated_devices_count(fixtures: Path) -> None:
    """SR-IOV: the device plugin gave this pod two DOWN virtual functions; the host's ACTIVE ones are not ours."""
    sysfs = fixtures / "sysfs/sriov_vfs"
    down = [p.parent.parent.parent.name for p in (sysfs / "class/infiniband").glob("*/ports/1/state")
            if "DOWN" in p.read_text()]
    addresses = [(sysfs / "class/infiniband" / name / "device/uevent").read_text().split("PCI_SLOT_NAME=")[1].split()[0]
                 for name in down[:2]]
    check = rdma_preflight({"PCIDEVICE_NVIDIA_COM_SRIOV_IB": ",".join(addresses)}, sysfs_root=sysfs, lib_dirs=[])
    assert check.refusal is not None and "DOWN" in check.refusal


@pytest.mark.parametrize("env", [{"NCCL_NET_PLUGIN": "ofi"}, {"NCCL_NET": "AWS Libfabric"}])
def test_a_plugin_fabric_needs_its_library_not_a_verbs_port(env: dict[str, str], fixtures: Path,
                                                            tmp_path: Path) -> None:
    (tmp_path / "libnccl-net-ofi.so").write_bytes(b"\x7fELF")
    check = rdma_preflight(env, sysfs_root=fixtures / "sysfs/no_rdma", lib_dirs=[str(tmp_path)])
    assert (check.refusal, check.warnings) == (None, [])
    assert check.notes[0].endswith(f"network plugin {tmp_path}/libnccl-net-ofi.so")


def test_a_missing_plugin_only_warns(fixtures: Path, tmp_path: Path) -> None:
    check = rdma_preflight({"NCCL_NET_PLUGIN": "ofi"}, sysfs_root=fixtures / "sysfs/ib_down", lib_dirs=[str(tmp_path)])
    assert check.refusal is None
    assert check.warnings == [f"NCCL_NET_PLUGIN=ofi: cannot find libnccl-net-ofi.so, libnccl-net_ofi.so, "
                              f"libnccl-net.so in {tmp_path} (nor is it a path); if NCCL cannot load it, it falls "
                              "back to sockets"]


def test_no_rdma_device_and_no_plugin_warns_that_it_cannot_tell(fixtures: Path, tmp_path: Path) -> None:
    check = rdma_preflight({}, sysfs_root=fixtures / "sysfs/no_rdma", lib_dirs=[str(tmp_path)])
    assert check.refusal is None
    assert check.warnings[0].startswith("cannot tell which RDMA fabric NCCL will use")
    (tmp_path / "libnccl-net.so.1").write_bytes(b"\x7fELF")
    found = rdma_preflight({}, sysfs_root=fixtures / "sysfs/no_rdma", lib_dirs=[str(tmp_path)])
    assert found.warnings == [] and "network plugin" in found.notes[0]


def test_library_dirs_start_with_ld_library_path() -> None:
    assert library_dirs({"LD_LIBRARY_PATH": "/opt/ofi/lib::/x"})[:3] == ["/opt/ofi/lib", "/x", "/usr/local/lib"]
