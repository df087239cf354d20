"""The ``local:`` section of a cluster file (schema: ``mlenv/backends/local.schema.json``), parsed for the local
backend. Imported at validate time for files with ``backend: local``, so it imports nothing heavy."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlenv.errors import show_value

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

DEFAULT_SUBNET = "10.77.0.0/24"


@dataclass(frozen=True)
class LocalSettings:
    """How the local backend makes its pods."""

    isolation: str
    """``namespaces`` (root and iproute2), ``processes``, or ``auto``."""
    interfaces: tuple[str, ...]
    """The NIC name inside each node's namespace, node by node."""
    subnet: str
    """The private IPv4 subnet the nodes' addresses come from."""
    root: str | None
    """Where the pods' directories go (default under .mlenv/local/)."""


def _subnet(reader: ClusterReader) -> str:
    subnet = reader.get("local", "subnet", default=DEFAULT_SUBNET)
    try:
        ipaddress.IPv4Network(subnet, strict=False)
    except ValueError as exc:
        reader.problem(("local", "subnet"), f"expected a private IPv4 subnet like {DEFAULT_SUBNET}, got "
                                            f"{show_value(subnet)} ({exc})")
        return DEFAULT_SUBNET
    return str(subnet)


def parse(reader: ClusterReader) -> LocalSettings:
    """The local backend's settings (BackendInfo.settings of ``local``)."""
    return LocalSettings(
        isolation=reader.get("local", "isolation", default="auto"),
        interfaces=tuple(reader.get("local", "interfaces", default=[])),
        subnet=_subnet(reader),
        root=reader.get("local", "root"),
    )
