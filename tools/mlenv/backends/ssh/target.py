"""What an ssh deployment's handle records (``Handle.data``), read back as one object: the hosts in rank order,
how to reach them, the workspace asked for and, once deploy has looked, each host's absolute workspace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlenv.backends.ssh.hosts import HostSpec
from mlenv.backends.ssh.transport import Transport
from mlenv.core.capabilities import Handle
from mlenv.errors import OperationError


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
    """Each host's absolute workspace, learned by deploy (empty before)."""

    def to_data(self) -> dict[str, Any]:
        """The handle's ``data``."""
        return {"hosts": [{"host": h.host, "user": h.user, "port": h.port} for h in self.hosts],
                "transport": self.transport.to_data(), "workdir": self.workdir, "python": self.python,
                "owner": self.owner, "gpus_per_node": self.gpus_per_node,
                "workspaces": list(self.workspaces)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SshTarget:
        """Inverse of ``to_data``; KeyError/TypeError/ValueError on a record of another shape."""
        hosts = tuple(HostSpec(str(h["host"]), h["user"], None if h["port"] is None else int(h["port"]))
                      for h in data["hosts"])
        return cls(hosts, Transport.from_data(data["transport"]), str(data["workdir"]), str(data["python"]),
                   str(data["owner"]), int(data["gpus_per_node"]), tuple(map(str, data["workspaces"])))

    @classmethod
    def of(cls, handle: Handle) -> SshTarget:
        """The target recorded in ``handle`` (UsageError when it is not an ssh deployment of this mlenv)."""
        return handle.decoded(cls.from_data)

    def label(self, ordinal: int) -> str:
        """How messages name host ``ordinal``: ``user@host:port`` as far as the file says."""
        return self.hosts[ordinal].display(self.transport.user)

    def workspace(self, ordinal: int) -> str:
        """Host ``ordinal``'s workspace: absolute once deployed, else as the file says (the host expands it)."""
        return self.workspaces[ordinal] if len(self.workspaces) == len(self.hosts) else self.workdir

    def deployed(self, name: str) -> tuple[str, ...]:
        """Each host's workspace; OperationError when deploy has not finished."""
        if len(self.workspaces) != len(self.hosts):
            raise OperationError(f"{name} is not deployed yet: run mlenv deploy (make deploy-cluster "
                                 f"CLUSTER={name}) first")
        return self.workspaces
