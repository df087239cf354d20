"""Rendered pods against the Pod Security Standards: the only departures from "restricted" are the ones a cluster
file asks for (IPC_LOCK; the image's or root's user on plain Kubernetes), and `mlenv validate` names each of them.

The checker below encodes the Baseline and Restricted controls of
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the profile PodSecurity admission enforces
with ``pod-security.kubernetes.io/enforce: restricted``). Each test renders through the real ``mlenv render``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT, run_mlenv

# --- the Pod Security Standards, as the page lists them --------------------------------------------------------

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}


@dataclass(frozen=True, order=True)
class Departure:
    """One control a pod fails: the lowest profile that forbids it, the control's name on the page, and the
    word (field or capability) a warning about it must name."""

    level: str
    control: str
    term: str


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _baseline(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> Iterator[Departure]:
    pod = spec.get("securityContext") or {}
    contexts = [pod, *((c.get("securityContext") or {}) for c in _containers(spec))]

    def bad(control: str, term: str) -> Departure:
        return Departure("baseline", control, term)

    if any((c.get("windowsOptions") or {}).get("hostProcess") for c in contexts):
        yield bad("HostProcess", "hostProcess")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield bad("Host Namespaces", field)
    if any(c.get("privileged") for c in contexts[1:]):
        yield bad("Privileged Containers", "privileged")
    for context in contexts[1:]:
        for capability in sorted(set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES):
            yield bad("Capabilities", capability)
    if any("hostPath" in volume for volume in spec.get("volumes") or []):
        yield bad("HostPath Volumes", "hostPath")
    if any(port.get("hostPort") for c in _containers(spec) for port in c.get("ports") or []):
        yield bad("Host Ports", "hostPort")
    apparmor = [value for key, value in (metadata.get("annotations") or {}).items()
                if key.startswith("container.apparmor.security.beta.kubernetes.io/")]
    if any(value != "runtime/default" and not value.startswith("localhost/") for value in apparmor) or any(
            (c.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in SECCOMP_TYPES for c in contexts):
        yield bad("AppArmor", "appArmorProfile")
    for context in contexts:
        options = context.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES or options.get("user") or options.get("role"):
            yield bad("SELinux", "seLinuxOptions")
    if any(c.get("procMount", "Default") != "Default" for c in contexts[1:]):
        yield bad("/proc Mount Type", "procMount")
    if any((c.get("seccompProfile") or {}).get("type") == "Unconfined" for c in contexts):
        yield bad("Seccomp", "seccompProfile")
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield bad("Sysctls", str(sysctl.get("name")))


def _restricted(spec: Mapping[str, Any]) -> Iterator[Departure]:
    pod = spec.get("securityContext") or {}
    containers = [c.get("securityContext") or {} for c in _containers(spec)]

    def bad(control: str, term: str) -> Departure:
        return Departure("restricted", control, term)

    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield bad("Volume Types", ",".join(sorted(kinds - RESTRICTED_VOLUMES)))
    if any(c.get("allowPrivilegeEscalation") is not False for c in containers):
        yield bad("Privilege Escalation", "allowPrivilegeEscalation")
    non_root = [c.get("runAsNonRoot", pod.get("runAsNonRoot")) for c in containers]
    if not all(value is True for value in non_root):
        yield bad("Running as Non-root", "runAsNonRoot")
    if pod.get("runAsUser") == 0 or any(c.get("runAsUser") == 0 for c in containers):
        yield bad("Running as Non-root user", "runAsUser")
    seccomp = [(c.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type") for c in containers]
    if not all(value in SECCOMP_TYPES for value in seccomp):
        yield bad("Seccomp", "seccompProfile")
    for context in containers:
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield bad("Capabilities", "drop ALL")
        for capability in sorted(set(capabilities.get("add") or []) - RESTRICTED_CAPABILITIES):
            yield bad("Capabilities", capability)


def departures(template: Mapping[str, Any]) -> list[Departure]:
    """Every control of Baseline and Restricted that the pod template fails, sorted."""
    metadata, spec = template.get("metadata") or {}, template["spec"]
    return sorted({*_baseline(metadata, spec), *_restricted(spec)})


IPC_LOCK = [Departure("baseline", "Capabilities", "IPC_LOCK"), Departure("restricted", "Capabilities", "IPC_LOCK")]
NON_ROOT = [Departure("restricted", "Running as Non-root", "runAsNonRoot")]
ROOT_USER = [*NON_ROOT, Departure("restricted", "Running as Non-root user", "runAsUser")]


# --- the checker itself catches what it should --------------------------------------------------------------


def _compliant() -> dict[str, Any]:
    return {"metadata": {}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "persistentVolumeClaim": {"claimName": "b"}}],
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}


@pytest.mark.parametrize(("path", "value", "expected"), [
    (("spec", "hostIPC"), True, Departure("baseline", "Host Namespaces", "hostIPC")),
    (("spec", "containers", 0, "securityContext", "privileged"), True,
     Departure("baseline", "Privileged Containers", "privileged")),
    (("spec", "containers", 0, "securityContext", "capabilities", "drop"), [],
     Departure("restricted", "Capabilities", "drop ALL")),
    (("spec", "containers", 0, "securityContext", "allowPrivilegeEscalation"), True,
     Departure("restricted", "Privilege Escalation", "allowPrivilegeEscalation")),
    (("spec", "securityContext", "runAsNonRoot"), False, NON_ROOT[0]),
    (("spec", "securityContext", "runAsUser"), 0, Departure("restricted", "Running as Non-root user", "runAsUser")),
    (("spec", "securityContext", "seccompProfile"), {"type": "Unconfined"},
     Departure("baseline", "Seccomp", "seccompProfile")),
    (("spec", "volumes", 0), {"name": "a", "hostPath": {"path": "/"}},
     Departure("baseline", "HostPath Volumes", "hostPath")),
    (("spec", "volumes", 1), {"name": "b", "nfs": {"server": "x", "path": "/"}},
     Departure("restricted", "Volume Types", "nfs")),
    (("spec", "containers", 0, "ports"), [{"containerPort": 1, "hostPort": 1}],
     Departure("baseline", "Host Ports", "hostPort")),
    (("spec", "securityContext", "sysctls"), [{"name": "kernel.msgmax", "value": "1"}],
     Departure("baseline", "Sysctls", "kernel.msgmax")),
])
def test_the_checker_finds_each_kind_of_departure(path: tuple[Any, ...], value: Any, expected: Departure) -> None:
    template = _compliant()
    assert departures(template) == []
    holder: Any = template
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    assert expected in departures(template)


# --- mlenv's pods -------------------------------------------------------------------------------------------


def write_cluster(directory: Path, backend: str = "openshift", name: str = "psa", app: str | None = None,
                  **security: Any) -> Path:
    """A small valid cluster file ``directory/<name>.yaml`` with these ``security`` settings (and ``app.name``)."""
    document = {"cluster": {"name": name, "namespace": "ml"}, "backend": backend,
                **({"app": {"name": app}} if app else {}),
                "storage": {"class_rwo": "standard"}, "gpus": {"per_node": 4, "default_nodes": 2},
                "security": {"service_account": "ml-dev-sa", **security}}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _mlenv(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The real ``mlenv`` in a project of its own."""
    return run_mlenv(*args, home=home, cwd=home)


def _template(path: Path, home: Path, mode: str = "tcp") -> dict[str, Any]:
    """The StatefulSet's pod template from the real ``mlenv render FILE --mode M``."""
    rendered = _mlenv("render", str(path), "--mode", mode, home=home)
    assert rendered.returncode == 0, rendered.stderr
    [statefulset] = [o for o in yaml.safe_load_all(rendered.stdout) if o["kind"] == "StatefulSet"]
    template: dict[str, Any] = statefulset["spec"]["template"]
    return template


def _assert_hardened(template: Mapping[str, Any], ipc_lock: bool) -> None:
    """What every pod mlenv renders carries, whatever the file says."""
    spec = template["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert key not in spec
    container, = spec["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {
        "drop": ["ALL"], **({"add": ["IPC_LOCK"]} if ipc_lock else {})}}


# backend, security section, the pod's securityContext beyond seccomp, the departures from "restricted"
CASES = [
    ("openshift", {}, {"runAsNonRoot": True}, []),
    ("openshift", {"ipc_lock": True}, {"runAsNonRoot": True}, IPC_LOCK),
    ("openshift", {"run_as_user": 1000}, {"runAsNonRoot": True, "runAsUser": 1000}, []),
    ("kubernetes", {}, {}, NON_ROOT),
    ("kubernetes", {"run_as_user": 1000}, {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000}, []),
    ("kubernetes", {"run_as_user": 0}, {"runAsUser": 0}, ROOT_USER),
    ("kubernetes", {"ipc_lock": True, "run_as_user": 1000}, {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
     IPC_LOCK),
    ("kubernetes", {"ipc_lock": True}, {}, sorted([*IPC_LOCK, *NON_ROOT])),
]
IDS = ["openshift", "openshift-ipc-lock", "openshift-uid", "kubernetes-image-user", "kubernetes-uid",
       "kubernetes-root", "kubernetes-ipc-lock-uid", "kubernetes-ipc-lock-image-user"]


@pytest.mark.parametrize(("backend", "security", "pod_context", "expected"), CASES, ids=IDS)
def test_pods_depart_from_restricted_only_where_the_file_asks(
        tmp_path: Path, backend: str, security: dict[str, Any], pod_context: dict[str, Any],
        expected: list[Departure]) -> None:
    template = _template(write_cluster(tmp_path, backend, **security), tmp_path)
    _assert_hardened(template, ipc_lock=bool(security.get("ipc_lock")))
    assert template["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, **pod_context}
    assert departures(template) == expected


WARNING_CASES = [pytest.param(*case, id=name) for case, name in zip(CASES, IDS, strict=True)]


@pytest.mark.parametrize(("backend", "security", "pod_context", "expected"), WARNING_CASES)
def test_validate_warns_of_each_departure(tmp_path: Path, backend: str, security: dict[str, Any],
                                          pod_context: dict[str, Any], expected: list[Departure]) -> None:
    path = write_cluster(tmp_path, backend, **security)
    result = _mlenv("validate", str(path), "--mode", "tcp", home=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING: ")]
    for departure in expected:  # a namespace admin reads which capability or field, and which level forbids it
        assert any(departure.term in line and f"'{departure.level}'" in line for line in warnings), (
            departure, warnings)
    if not expected:
        assert not [line for line in warnings if "Pod Security" in line], warnings


def test_root_on_openshift_is_refused(tmp_path: Path) -> None:
    path = write_cluster(tmp_path, "openshift", run_as_user=0)
    line, column = next((number, text.index("run_as_user") + 1) for number, text in
                        enumerate(path.read_text().splitlines(), start=1) if "run_as_user" in text)
    for command in ("validate", "render"):
        result = _mlenv(command, str(path), "--mode", "tcp", home=tmp_path)
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"error: {path}:{line}:{column}: security.run_as_user: 0 (root) cannot run on OpenShift: its "
            "restricted-v2 SCC assigns each pod a non-root UID from the namespace's range; remove "
            "security.run_as_user"]
        assert result.stdout == ""


def _kube_files() -> list[tuple[Path, str]]:
    """Every shipped and seed cluster file of the OpenShift/Kubernetes backend, in each mode it allows (a file that
    does not load is listed too: its test shows why)."""
    from mlenv.core.clusters import load_cluster
    from mlenv.errors import MlenvError

    found = []
    for path in sorted([*(ROOT / "clusters").glob("*.yaml"), *(ROOT / "tests/fixtures/clusters").glob("*.yaml")]):
        try:
            cluster = load_cluster(str(path))
        except MlenvError:
            found.append((path, "tcp"))
            continue
        if cluster.backend in ("openshift", "kubernetes"):
            found += [(path, mode) for mode in (["rdma", "tcp"] if cluster.rdma.enabled else ["tcp"])]
    return found


@pytest.mark.parametrize(("path", "mode"), _kube_files(), ids=lambda value: getattr(value, "name", value))
def test_every_shipped_cluster_file_renders_hardened_pods(tmp_path: Path, path: Path, mode: str) -> None:
    from mlenv.core.clusters import load_cluster

    cluster = load_cluster(str(path))
    template = _template(path, tmp_path, mode)
    _assert_hardened(template, ipc_lock=cluster.security.ipc_lock)
    allowed = {*(IPC_LOCK if cluster.security.ipc_lock else [])}
    if cluster.backend == "kubernetes":
        allowed |= {*{None: NON_ROOT, 0: ROOT_USER}.get(cluster.security.run_as_user, [])}
    assert set(departures(template)) <= allowed
