"""OpenShift's rules on the common sections of a cluster file (its SCC), run by validate for openshift files
(``BackendInfo.rules``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader


def check(reader: ClusterReader) -> None:
    """Root cannot run under restricted-v2; mlenv never uses the privileged SCC."""
    run_as_user = reader.get("security", "run_as_user")
    if type(run_as_user) is int and run_as_user == 0:
        reader.problem(("security", "run_as_user"),
                       "0 (root) cannot run on OpenShift: its restricted-v2 SCC assigns each pod a non-root UID "
                       "from the namespace's range; remove security.run_as_user")
    if reader.get("security", "requires_privileged_scc", default=False):
        reader.warn("security.requires_privileged_scc is ignored: mlenv never uses the privileged SCC; with "
                    "security.ipc_lock: true it renders a minimal SCC that allows only IPC_LOCK (mlenv render --admin)")
