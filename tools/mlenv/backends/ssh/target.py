"""What an ssh deployment's handle records (``Handle.data``), read back as one object: the hosts in rank order, the
spare hosts, how to reach them, the workspace asked for and, once deploy has looked, each host's absolute
workspace. A machine's ordinal is its node rank for the hosts, and counts on after them for the spares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlenv.backends.sshlink.hosts import HostSpec
from mlenv.backends.sshlink.transport import Transport
from mlenv.core.capabilities import Handle
from mlenv.errors import OperationError
from mlenv.runtime.records.jsonvalue import JsonObject


@dataclass(frozen=True)
class SshTarget:
    """The recorded hosts of a deployment and how to reach them."""

    hosts: tuple[HostSpec, ...]
    transport: Transport
    workdir: str
    python: str
    owner: str
    """Marks the workspaces deploy created (``.mlenv/owner``): only those are ever deleted."""
    gpus_per_node: int
    workspaces: tuple[str, ...] = ()
    """Each machine's absolute workspace (hosts, then spares), learned by deploy (empty before)."""
    spares: tuple[HostSpec, ...] = ()
    """Hosts that take an excluded node's place."""

    def to_data(self) -> JsonObject:
        """The handle's ``data``."""
        return {"hosts": [{"host": h.host, "user": h.user, "port": h.port} for h in self.hosts],
                "transport": self.transport.to_data(), "workdir": self.workdir, "python": self.python,
                "owner": self.owner, "gpus_per_node": self.gpus_per_node,
                "workspaces": list(self.workspaces),
                **({"spares": [{"host": h.host, "user": h.user, "port": h.port} for h in self.spares]}
                   if self.spares else {})}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SshTarget:
        """Inverse of ``to_data``; KeyError/TypeError/ValueError on a record of another shape."""
        def hosts(listed: Any) -> tuple[HostSpec, ...]:
            return tuple(HostSpec(str(h["host"]), h["user"], None if h["port"] is None else int(h["port"]))
                         for h in listed)

        return cls(hosts(data["hosts"]), Transport.from_data(data["transport"]), str(data["workdir"]),
                   str(data["python"]), str(data["owner"]), int(data["gpus_per_node"]),
                   tuple(map(str, data["workspaces"])), hosts(data.get("spares", ())))

    @classmethod
    def of(cls, handle: Handle) -> SshTarget:
        """The target recorded in ``handle`` (UsageError when it is not an ssh deployment of this mlenv)."""
        return handle.decoded(cls.from_data)

    @property
    def machines(self) -> tuple[HostSpec, ...]:
        """The hosts, then the spares: every machine deploy prepares and sync keeps current."""
        return (*self.hosts, *self.spares)

    def label(self, ordinal: int) -> str:
        """How messages name machine ``ordinal``: ``user@host:port`` as far as the file says."""
        return self.machines[ordinal].display(self.transport.user)

    def machine(self, name: str, ordinal: int) -> HostSpec:
        """The machine a node named ``name`` runs on: the one of that label (a spare in a node's place), else
        machine ``ordinal``."""
        labels = [self.label(index) for index in range(len(self.machines))]
        return self.machines[labels.index(name) if name in labels else ordinal]

    def workspace(self, ordinal: int) -> str:
        """Machine ``ordinal``'s workspace: absolute once deployed, else as the file says (the host expands it)."""
        return self.workspaces[ordinal] if len(self.workspaces) == len(self.machines) else self.workdir

    def deployed(self, name: str) -> tuple[str, ...]:
        """Each machine's workspace; OperationError when deploy has not finished."""
        if len(self.workspaces) != len(self.machines):
            raise OperationError(f"{name} is not deployed yet: run mlenv deploy (make deploy-cluster "
                                 f"CLUSTER={name}) first")
        return self.workspaces
