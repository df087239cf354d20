"""Network plumbing of the local backend: a bridge in a namespace of its own, one namespace per pod joined
to it by a veth pair, and a per-namespace /etc/hosts. Everything goes through ``ip``; nothing is added to
the host's network namespace."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from mlenv.errors import OperationError

BRIDGE = "br0"
NETNS_ETC = Path("/etc/netns")


def available() -> bool:
    """True when this process can create network namespaces (root with iproute2)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise OperationError(f"ip {' '.join(args)} failed: {result.stderr.strip() or result.returncode}")
    return result


def namespaces() -> set[str]:
    """Names of every network namespace that ``ip netns`` knows, whole: read from its JSON, since its text listing
    prints a name holding a space or a newline as something else."""
    return {entry["name"] for entry in json.loads(_ip("-j", "netns", "list").stdout or "[]")}


def delete_namespace(name: str) -> None:
    """Remove a namespace (its veth ends go with it) and its /etc/netns directory; absent is fine."""
    if name in namespaces():
        _ip("netns", "delete", name)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    with contextlib.suppress(OSError):  # only when no other namespace has files there
        NETNS_ETC.rmdir()


def ensure_bridge(netns: str) -> None:
    """A namespace holding an up bridge ``br0``; created or repaired."""
    if netns not in namespaces():
        _ip("netns", "add", netns)
    if _ip("-n", netns, "link", "show", BRIDGE, check=False).returncode != 0:
        _ip("-n", netns, "link", "add", BRIDGE, "type", "bridge")
    _ip("-n", netns, "link", "set", BRIDGE, "up")


def configured(netns: str, nic: str, cidr: str) -> bool:
    """True when ``nic`` in ``netns`` is up with address ``cidr`` and loopback is up."""
    if netns not in namespaces():
        return False
    shown = _ip("-n", netns, "-j", "addr", "show", check=False)
    if shown.returncode != 0:
        return False
    links = {link["ifname"]: link for link in json.loads(shown.stdout or "[]")}
    link, loopback = links.get(nic), links.get("lo")
    if link is None or loopback is None or "UP" not in link.get("flags", []) or "UP" not in loopback["flags"]:
        return False
    return any(f"{a.get('local')}/{a.get('prefixlen')}" == cidr for a in link.get("addr_info", []))


def ensure_pod(bridge_netns: str, port: str, netns: str, nic: str, cidr: str) -> None:
    """Pod namespace ``netns`` with ``nic`` (address ``cidr``) cabled to the bridge through ``port``.

    A pod that is already right is left alone (running jobs keep their network); anything half-made by an
    earlier, interrupted run is deleted and made again.
    """
    if configured(netns, nic, cidr):
        return
    delete_namespace(netns)
    _ip("-n", bridge_netns, "link", "delete", port, check=False)
    _ip("netns", "add", netns)
    _ip("-n", bridge_netns, "link", "add", port, "type", "veth", "peer", "name", nic, "netns", netns)
    _ip("-n", bridge_netns, "link", "set", port, "master", BRIDGE, "up")
    _ip("-n", netns, "addr", "add", cidr, "dev", nic)
    _ip("-n", netns, "link", "set", nic, "up")
    _ip("-n", netns, "link", "set", "lo", "up")


def write_etc(netns: str, entries: Sequence[tuple[str, Sequence[str]]]) -> None:
    """/etc/netns/<netns>/{hosts,resolv.conf}, which ``ip netns exec`` mounts over /etc: the pods' names
    (``entries``) and no DNS server but the pod's own loopback, so lookups never leave the pod."""
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    hosts += [f"{address}\t{' '.join(names)}" for address, names in entries]
    files = {"hosts": "\n".join(hosts) + "\n",
             "resolv.conf": "# mlenv local pod: names come from /etc/hosts\nnameserver 127.0.0.1\noptions attempts:1\n"}
    directory = NETNS_ETC / netns
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        tmp = directory / f"{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, directory / name)


def exec_prefix(netns: str) -> list[str]:
    """The argv prefix that runs a command inside ``netns``."""
    return ["ip", "netns", "exec", netns]
