"""Reading RDMA devices from sysfs, device-plugin allocations and NCCL_IB_HCA filters."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlenv.runtime.node.rdma import allocated_pci_addresses, match_nccl_hca_filter, scan_hcas


def test_scan_reads_devices_ports_and_sparse_gid_tables(fixtures: Path) -> None:
    (hca,) = scan_hcas(fixtures / "sysfs" / "macvlan_sparse")
    assert (hca.name, hca.pci_address, hca.numa_node) == ("mlx5_2", "0000:31:00.0", 0)
    (port,) = hca.ports
    assert (port.name, port.state, port.link_layer, port.is_roce) == ("mlx5_2:1", "ACTIVE", "Ethernet", True)
    # zero entries are skipped; an unreadable type file leaves the type unknown
    assert [(g.index, g.type) for g in port.gids] == [
        (0, "IB/RoCE v1"), (1, "RoCE v2"), (8, "IB/RoCE v1"), (9, "RoCE v2"), (10, None), (12, "RoCE v2"),
    ]
    assert port.ipv4_roce_v2_indices() == [9]


def test_scan_orders_names_naturally_and_reads_states(fixtures: Path) -> None:
    hcas = scan_hcas(fixtures / "sysfs" / "sriov_vfs")
    assert [h.name for h in hcas] == [f"mlx5_{n}" for n in range(12)]
    assert [h.ports[0].state for h in hcas] == ["DOWN"] * 6 + ["ACTIVE"] * 6
    assert hcas[6].pci_address == "0000:1a:00.2"


def test_no_rdma_devices(fixtures: Path) -> None:
    assert scan_hcas(fixtures / "sysfs" / "no_rdma") == []


def test_allocations_from_device_plugin_variables() -> None:
    environ = {
        "PCIDEVICE_OPENSHIFT_IO_MLXNICS": "0000:1A:00.2,0000:1b:00.3",
        "PCIDEVICE_OPENSHIFT_IO_MLXNICS_INFO": '{"0000:1c:00.2": {"generic": {"deviceID": "0000:1c:00.2"}}}',
        "PCIDEVICE_BROKEN_INFO": "{not json",
        "PCIDEVICE_NOT_PCI": "uverbs3",
        "HOSTNAME": "0000:1d:00.2",
    }
    assert allocated_pci_addresses(environ) == {
        "PCIDEVICE_OPENSHIFT_IO_MLXNICS": {"0000:1a:00.2", "0000:1b:00.3"},
        "PCIDEVICE_OPENSHIFT_IO_MLXNICS_INFO": {"0000:1c:00.2"},
    }


NAMES = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_10", "mlx5_bond_0"]


@pytest.mark.parametrize(("spec", "selected"), [
    ("mlx5_bond_", ["mlx5_bond_0"]),  # prefix, as the old toolkit wrote it
    ("mlx5_1", ["mlx5_1", "mlx5_10"]),  # prefixes also match longer names
    ("=mlx5_1", ["mlx5_1"]),  # = asks for exact names
    ("=mlx5_0:1,mlx5_4:1", ["mlx5_0", "mlx5_4"]),  # ports are ignored for the device choice
    ("^mlx5_4", ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_bond_0"]),
    ("^=mlx5_1", ["mlx5_0", "mlx5_4", "mlx5_10", "mlx5_bond_0"]),
])
def test_nccl_ib_hca_filter(spec: str, selected: list[str]) -> None:
    assert match_nccl_hca_filter(spec, NAMES) == selected
