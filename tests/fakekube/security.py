"""A container's security context as the kubelet and CRI-O apply it: who it runs as, which capabilities it keeps,
whether it may gain privileges, whether its root is read-only, and the group its volumes belong to.

Container fields override the pod's (``DetermineEffectiveSecurityContext``). There is no image: its user is
root (uid 0, gid 0). What fakekube cannot honour is refused (:class:`Refused`), never ignored: SELinux options,
sysctls, Windows options, seccomp profiles other than RuntimeDefault (accepted: fakekube applies no filter, as
if the runtime's default were to allow everything) and Unconfined, AppArmor profiles other than Unconfined,
an unmasked /proc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)
"""Linux capabilities by number (``CAP_CHOWN`` is 0)."""
RUNTIME_DEFAULT = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
                   "KILL")
"""What CRI-O gives a container that adds and drops nothing."""
POD_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "fsGroupChangePolicy", "supplementalGroups",
              "supplementalGroupsPolicy", "seccompProfile", "appArmorProfile"}
CONTAINER_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "capabilities",
                    "allowPrivilegeEscalation", "privileged", "seccompProfile", "appArmorProfile", "procMount"}
ACCEPTED_PROFILES = {"seccompProfile": ("RuntimeDefault", "Unconfined"), "appArmorProfile": ("Unconfined",)}


class Refused(Exception):
    """The container cannot start: ``reason`` (the waiting state's reason) and the kubelet's message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Security:
    """What the sandbox applies before it becomes the container's command."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    """Supplementary groups: fsGroup, then supplementalGroups."""
    capabilities: tuple[int, ...]
    """The bounding set (and, for uid 0, the effective set); a non-root user has none in effect, as in a pod."""
    no_new_privs: bool
    read_only_root: bool
    fs_group: int | None
    fs_group_on_root_mismatch: bool
    """``fsGroupChangePolicy: OnRootMismatch``: a volume whose root already has the group is left as it is."""

    def document(self) -> dict[str, Any]:
        """As the sandbox's spec carries it."""
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                "capabilities": list(self.capabilities), "no_new_privs": self.no_new_privs,
                "read_only_root": self.read_only_root}


def _cannot(where: str, field: str, value: object) -> Refused:
    return Refused("CreateContainerError",
                   f"fakekube cannot honour {where}.securityContext.{field} ({value!r}): remove it, or run this pod "
                   "on a real cluster")


def _check_supported(where: str, context: dict[str, Any], fields: set[str]) -> None:
    for name, value in context.items():
        if value is None:
            continue
        if name not in fields:
            raise _cannot(where, name, value)
        if name in ACCEPTED_PROFILES and (value or {}).get("type") not in ACCEPTED_PROFILES[name]:
            raise _cannot(where, name, value)
        if name == "procMount" and value != "Default":
            raise _cannot(where, name, value)


def _capability(name: str) -> str:
    bare = str(name).upper().removeprefix("CAP_")
    if bare != "ALL" and bare not in CAPABILITIES:
        raise Refused("CreateContainerError", f"unknown capability {name!r}")
    return bare


def capability_set(context: dict[str, Any]) -> set[str]:
    """The capabilities a container gets from the runtime's default set and its ``capabilities`` add and drop
    (CRI-O's order: ``add: [ALL]`` starts from every one, ``drop: [ALL]`` from none, then the others)."""
    if context.get("privileged"):
        return set(CAPABILITIES)
    asked = context.get("capabilities") or {}
    add = {_capability(c) for c in asked.get("add") or []}
    drop = {_capability(c) for c in asked.get("drop") or []}
    kept = set(CAPABILITIES) if "ALL" in add else set(RUNTIME_DEFAULT)
    if "ALL" in drop:
        kept = set()
    return (kept | (add - {"ALL"})) - (drop - {"ALL"})


def pod_name(pod: dict[str, Any]) -> str:
    """``name_namespace(uid)``, as the kubelet names a pod in its messages."""
    meta = pod["metadata"]
    return f"{meta['name']}_{meta.get('namespace', '')}({meta.get('uid', '')})"


def effective(pod: dict[str, Any], container: dict[str, Any]) -> Security:
    """The security the container runs with; :class:`Refused` when it must not start or fakekube cannot honour
    part of it."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    _check_supported("spec", pod_context, POD_FIELDS)
    _check_supported(f"containers[{container.get('name', '')}]", own, CONTAINER_FIELDS)
    merged = {**{k: v for k, v in pod_context.items() if v is not None}, **{k: v for k, v in own.items()
                                                                             if v is not None}}
    uid, gid = merged.get("runAsUser"), merged.get("runAsGroup")
    if merged.get("runAsNonRoot"):
        where = f"(pod: {pod_name(pod)!r}, container: {container.get('name', '')})".replace("'", '"')
        if uid == 0:
            raise Refused("CreateContainerConfigError", f"container's runAsUser breaks non-root policy {where}")
        if uid is None:  # the image's user: root, there being no image
            raise Refused("CreateContainerConfigError",
                          f"container has runAsNonRoot and image will run as root {where}")
    fs_group = pod_context.get("fsGroup")
    groups = [*([fs_group] if fs_group is not None else []), *(pod_context.get("supplementalGroups") or [])]
    escalation = own.get("allowPrivilegeEscalation")
    return Security(
        uid=int(uid or 0), gid=int(gid or 0), groups=tuple(int(g) for g in dict.fromkeys(groups)),
        capabilities=tuple(sorted(CAPABILITIES.index(c) for c in capability_set(own))),
        no_new_privs=escalation is False and not own.get("privileged"),
        read_only_root=bool(own.get("readOnlyRootFilesystem")),
        fs_group=None if fs_group is None else int(fs_group),
        fs_group_on_root_mismatch=pod_context.get("fsGroupChangePolicy") == "OnRootMismatch")
