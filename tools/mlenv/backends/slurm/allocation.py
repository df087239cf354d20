"""The allocation a Slurm deployment holds, as its handle records it (``data["allocation"]``): the one typed view
every verb reads it through, and the one place that writes it back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mlenv.core.capabilities import Handle


@dataclass(frozen=True)
class Allocation:
    """The allocation's batch job: its id and the digest of its script once deploy submitted it; its master's
    address, each node's address and its hosts once it ran (None before, and in a record of an older mlenv)."""

    id: str | None = None
    digest: str | None = None
    master_addr: str | None = None
    addresses: tuple[str | None, ...] | None = None
    hosts: tuple[str, ...] | None = None

    @property
    def held(self) -> tuple[str, ...]:
        """The allocation's nodes as deploy found them running (none before, and in a record of an older mlenv)."""
        return self.hosts or ()

    @classmethod
    def of(cls, handle: Handle) -> Allocation:
        """``handle``'s allocation (an empty one before deploy submitted it), read once per handle."""
        return handle.decoded(cls._from_data)

    @classmethod
    def _from_data(cls, data: Mapping[str, Any]) -> Allocation:
        recorded = data.get("allocation") or {}
        job_id, digest, master = recorded.get("id"), recorded.get("digest"), recorded.get("master_addr")
        addresses, hosts = recorded.get("addresses"), recorded.get("hosts")
        return cls(job_id if isinstance(job_id, str) and job_id.isdigit() else None,
                   digest if isinstance(digest, str) else None, str(master) if master else None,
                   None if addresses is None else tuple(None if a is None else str(a) for a in addresses),
                   None if hosts is None else tuple(map(str, hosts)))

    def on(self, handle: Handle) -> Handle:
        """``handle`` recording this allocation (the keys an earlier mlenv wrote; unknown ones left out)."""
        fields = {"id": self.id, "digest": self.digest, "master_addr": self.master_addr,
                  "addresses": None if self.addresses is None else list(self.addresses),
                  "hosts": None if self.hosts is None else list(self.hosts)}
        return replace(handle, data={**handle.data,
                                     "allocation": {key: value for key, value in fields.items() if value is not None}})
