"""fakekube's kubelet (``run_pods=True``) through the real kubectl: containers really run, exec over WebSocket
with stdin and exit codes, logs -f from the real output, CrashLoopBackOff, graceful deletion, replaced pods, many
execs at once, and the security context (user, groups, fsGroup, capabilities, a read-only root, what is refused;
on OpenShift the SCC's UID)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlenv.backends.kubeapi.explain import pod_trouble

from tests.fakekube.fixtures import FakeCluster
from tests.fakekube.kubelet import home
from tests.fakekube.security import CAPABILITIES, RUNTIME_DEFAULT
from tests.integration.kube_pods import pod_processes

WAIT_SECONDS = 60.0


def pod(name: str, script: str, *, restart: str = "Always", grace: int = 30) -> str:
    """A pod running ``sh -c SCRIPT`` in /work (an emptyDir), with its name from the downward API."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": grace, "containers": [{
            "name": "main", "image": "busybox", "command": ["sh", "-c", script], "workingDir": "/work",
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hi $(POD_NAME)"}],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "shm", "mountPath": "/dev/shm"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}]},
    })


def until(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it is truthy (and return it); fail naming ``what`` after WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def get_pod(cluster: FakeCluster, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", "pod", name, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def running(cluster: FakeCluster, name: str) -> dict[str, Any]:
    """Wait until pod ``name``'s container runs; the pod."""
    def check() -> dict[str, Any] | None:
        found = get_pod(cluster, name)
        states = [s.get("state", {}) for s in (found or {}).get("status", {}).get("containerStatuses") or []]
        return found if states and "running" in states[0] else None
    return dict(until(check, f"pod {name} running"))


@pytest.fixture
def cluster(fake_kube_factory: Callable[..., FakeCluster]) -> FakeCluster:
    return fake_kube_factory(run_pods=True, restart_backoff=0.5)


def pods_root(cluster: FakeCluster) -> Path:
    assert cluster.server.kubelet is not None
    return cluster.server.kubelet.root


def test_exec_runs_in_the_container_with_stdin_and_exit_codes(cluster: FakeCluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=pod("p", "echo started $GREETING; exec sleep infinity"))
    status = running(cluster, "p")["status"]
    answer = cluster.kubectl("exec", "p", "--", "sh", "-c",
                             'echo "$(hostname) $(pwd) $POD_NAME"; cat /proc/1/cmdline | tr "\\0" " "; '
                             'grep -c . /etc/hosts; echo oops >&2; exit 3')
    assert answer.returncode == 3, answer
    lines = answer.stdout.splitlines()
    assert lines[0] == "p /work p"
    assert lines[1].startswith("sleep infinity ")  # PID 1 is the container's command (sh exec'd it)
    assert "oops" in answer.stderr and "command terminated with exit code 3" in answer.stderr
    echoed = cluster.kubectl("exec", "-i", "p", "--", "sh", "-c", "cat > /dev/shm/x && wc -c < /dev/shm/x",
                             input="x" * 100_000)
    assert (echoed.returncode, echoed.stdout.strip()) == (0, "100000"), echoed
    missing = cluster.kubectl("exec", "p", "--", "no-such-command")
    assert missing.returncode == 127 and "command terminated with exit code 127" in missing.stderr
    not_runnable = cluster.kubectl("exec", "p", "--", "/etc/hostname")
    assert not_runnable.returncode == 126, not_runnable
    assert cluster.kubectl("logs", "p").stdout == "started hi p\n"
    if cluster.server.kubelet and cluster.server.kubelet.network:  # root: a network namespace of its own
        addresses = cluster.kubectl("exec", "p", "--", "ip", "-br", "-4", "addr").stdout
        assert status["podIP"] in addresses and status["podIP"] != "127.0.0.1"


def test_logs_follow_the_real_output_until_the_container_ends(cluster: FakeCluster) -> None:
    script = "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo bye >&2"
    cluster.kubectl("apply", "-f", "-", input=pod("p", script, restart="Never"))
    running(cluster, "p")
    followed = cluster.kubectl("logs", "-f", "p")
    assert followed.returncode == 0 and followed.stdout == "line 1\nline 2\nline 3\nbye\n", followed
    ended = until(lambda: (get_pod(cluster, "p") or {}).get("status", {}).get("phase") == "Succeeded", "Succeeded")
    assert ended
    refused = cluster.kubectl("exec", "p", "--", "true")
    assert refused.returncode != 0 and "completed pod" in refused.stderr


def test_a_container_that_exits_at_once_crash_loops_with_its_exit_code(cluster: FakeCluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=pod("p", "echo boom; exit 3"))

    def crash_looping() -> dict[str, Any] | None:
        found = get_pod(cluster, "p") or {}
        statuses = found.get("status", {}).get("containerStatuses") or [{}]
        waiting = statuses[0].get("state", {}).get("waiting", {})
        return found if waiting.get("reason") == "CrashLoopBackOff" and statuses[0]["restartCount"] >= 1 else None

    found = until(crash_looping, "CrashLoopBackOff")
    container = found["status"]["containerStatuses"][0]
    assert container["lastState"]["terminated"]["exitCode"] == 3
    assert found["status"]["phase"] == "Running" and not container["ready"]
    trouble = pod_trouble(found, [])
    assert trouble is not None and "exit code 3" in trouble.words and "CrashLoopBackOff" in trouble.words
    assert "boom" in cluster.kubectl("logs", "p").stdout
    refused = cluster.kubectl("exec", "p", "--", "true")
    assert refused.returncode == 1 and 'container not found ("main")' in refused.stderr, refused


def test_delete_sends_sigterm_then_sigkill_after_the_grace_period(cluster: FakeCluster) -> None:
    polite = "trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done"
    cluster.kubectl("apply", "-f", "-", input=pod("polite", polite, grace=30))
    cluster.kubectl("apply", "-f", "-", input=pod("deaf", "exec sleep infinity", grace=2))  # PID 1 ignores TERM
    running(cluster, "polite")
    running(cluster, "deaf")
    started = time.monotonic()
    assert cluster.kubectl("delete", "pod", "polite").returncode == 0
    assert time.monotonic() - started < 10
    started = time.monotonic()
    assert cluster.kubectl("delete", "pod", "deaf").returncode == 0
    assert 2 <= time.monotonic() - started < 15
    until(lambda: not pod_processes(pods_root(cluster)), "no pod process left")


def test_replaced_and_scaled_down_pods_end_their_processes(cluster: FakeCluster) -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "w"},
           "spec": {"replicas": 2, "serviceName": "w", "selector": {"matchLabels": {"app": "w"}},
                    "template": {"metadata": {"labels": {"app": "w"}}, "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "x", "command": ["sleep", "infinity"]}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(sts))
    first = {n: running(cluster, n)["metadata"]["uid"] for n in ("w-0", "w-1")}
    # the headless Service's names, once the controller has seen w-1's IP (eventually, as cluster DNS is)
    until(lambda: "w-1.w.ml.svc.cluster.local" in cluster.kubectl("exec", "w-0", "--", "cat", "/etc/hosts").stdout,
          "w-1's name in w-0's /etc/hosts")
    until(lambda: len(pod_processes(pods_root(cluster))) == 2, "two pods' processes")
    assert cluster.kubectl("scale", "sts", "w", "--replicas=1").returncode == 0
    until(lambda: get_pod(cluster, "w-1") is None, "w-1 gone")
    until(lambda: len(pod_processes(pods_root(cluster))) == 1, "only w-0's process")
    cluster.kubectl("set", "env", "sts/w", "X=1")
    until(lambda: (running(cluster, "w-0")["metadata"]["uid"] != first["w-0"]), "w-0 replaced")
    until(lambda: len(pod_processes(pods_root(cluster))) == 1, "only the new w-0's process")


def test_64_parallel_execs_are_all_served_in_bounded_memory(cluster: FakeCluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=pod("p", "exec sleep infinity"))
    running(cluster, "p")
    before = _rss_kib()
    results: dict[int, Any] = {}

    def one(index: int) -> None:
        results[index] = cluster.kubectl("exec", "-i", "p", "--", "sh", "-c", f"head -c 200000 >/dev/null; "
                                         f"echo {index}", input="y" * 200_000, timeout=180)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = {i: (r.returncode, r.stderr) for i, r in results.items() if r.returncode != 0}
    assert sorted(int(r.stdout) for r in results.values() if r.returncode == 0) == list(range(64)), failed
    grown = _rss_kib() - before
    assert grown < 200 * 1024, f"the fake's memory grew by {grown} KiB"
    until(lambda: threading.active_count() < 40, "exec threads gone")


def _rss_kib() -> int:
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_exec_with_a_terminal(cluster: FakeCluster) -> None:
    """``kubectl exec -it`` from a terminal: the command gets a terminal of its size, input is echoed back, and
    kubectl exits with its code."""
    import pty

    cluster.kubectl("apply", "-f", "-", input=pod("p", "exec sleep infinity"))
    running(cluster, "p")
    assert cluster.kubectl_path is not None
    pid, terminal = pty.fork()
    if pid == 0:  # the child: kubectl on a terminal of its own
        os.execve(cluster.kubectl_path, [cluster.kubectl_path, "exec", "-it", "p", "--", "sh", "-c",  # noqa: S606
                                         'tty; stty size; read line; echo "got $line"; exit 5'], cluster.env)
    seen = b""
    os.write(terminal, b"hello\n")
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: kubectl closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 5, text
    assert "/dev/pts/" in text and "got hello" in text, text


def test_without_network_namespaces_pods_share_loopback(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    """As without root (``pod_network=False`` here): pods share this machine's network, pod IP 127.0.0.1, and
    their headless Service's names resolve to it; PID, mount and UTS namespaces as ever."""
    cluster = fake_kube_factory(run_pods=True, pod_network=False)
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "w"},
           "spec": {"replicas": 2, "serviceName": "w", "selector": {"matchLabels": {"app": "w"}},
                    "template": {"metadata": {"labels": {"app": "w"}}, "spec": {
                        "containers": [{"name": "main", "image": "x", "command": ["sleep", "infinity"]}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(sts))
    assert running(cluster, "w-0")["status"]["podIP"] == running(cluster, "w-1")["status"]["podIP"] == "127.0.0.1"
    fqdn = "w-0.w.ml.svc.cluster.local"
    until(lambda: fqdn in cluster.kubectl("exec", "w-1", "--", "cat", "/etc/hosts").stdout,
          "w-0's names in w-1's /etc/hosts")  # once the controller has seen w-0's IP
    # resolved by the short name: in this sandbox glibc sends dotted names to the machine's DNS server first when the
    # pod shares its network, which is not what is tested here (the names and the shared IP are)
    inside = cluster.kubectl("exec", "w-1", "--", "sh", "-c", "hostname; getent hosts w-0")
    assert inside.stdout.split() == ["w-1", "127.0.0.1", fqdn, "w-0.w.ml.svc", "w-0.w", "w-0"], inside


@pytest.fixture
def plain(fake_kube_factory: Callable[..., FakeCluster]) -> FakeCluster:
    """Plain Kubernetes (no SCC admission): pods run with the security context they ask for."""
    return fake_kube_factory(run_pods=True, openshift=False)


def secured_pod(name: str, script: str, pod_context: dict[str, Any], context: dict[str, Any]) -> str:
    """A pod running ``sh -c SCRIPT`` once with these pod and container security contexts, an emptyDir at /work."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "securityContext": pod_context, "containers": [{
            "name": "main", "image": "x", "command": ["sh", "-c", script], "securityContext": context,
            "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}]},
    })


def finished(cluster: FakeCluster, name: str) -> str:
    """Wait until pod ``name`` ended (Succeeded or Failed); its log."""
    until(lambda: (get_pod(cluster, name) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed"),
          f"pod {name} ended")
    return cluster.kubectl("logs", name).stdout


def waiting(cluster: FakeCluster, name: str) -> dict[str, Any]:
    """Wait until pod ``name``'s container waits with a reason other than ContainerCreating; that state."""
    def check() -> dict[str, Any] | None:
        statuses = (get_pod(cluster, name) or {}).get("status", {}).get("containerStatuses") or [{}]
        state = statuses[0].get("state", {}).get("waiting") or {}
        return state if state.get("reason") not in (None, "ContainerCreating") else None
    return dict(until(check, f"pod {name} waiting"))


RESTRICTED = {"runAsUser": 1000, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
              "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_a_restricted_pod_runs_as_its_user_and_cannot_write_the_host(plain: FakeCluster, tmp_path: Path) -> None:
    """runAsUser 1000, runAsNonRoot, a read-only root and every capability dropped: ``id`` says uid 1000, the
    host's /tmp (and, even as root, anything outside the pod's volumes) cannot be written; its volume can."""
    host_file = tmp_path / "from-the-pod"
    host_tmp = Path("/tmp") / f"fakekube-{uuid.uuid4().hex}"  # the host's own /tmp (1777)
    script = (f"echo $(id -u) $(id -g) $(id -G); grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; "
              "echo HOME=$HOME; "
              f"echo x > {host_tmp} && echo wrote-host; echo y > /work/mine && echo wrote-volume; "
              "touch /etc/x || echo read-only-etc")
    plain.kubectl("apply", "-f", "-", input=secured_pod("restricted", script, {}, RESTRICTED))
    try:
        log = finished(plain, "restricted")
        assert not host_tmp.exists(), log
    finally:
        host_tmp.unlink(missing_ok=True)
    assert log.splitlines()[0] == "1000 0 0", log  # no runAsGroup: the image user's group, root's
    assert "CapEff:\t0000000000000000" in log and "CapBnd:\t0000000000000000" in log and "NoNewPrivs:\t1" in log
    assert "wrote-host" not in log and f"{host_tmp}: Read-only file system" in log, log
    assert "wrote-volume" in log and "read-only-etc" in log, log
    assert f"HOME={home(1000)}\n" in log  # as in this machine's (the "image's") passwd, else /

    as_root = {"readOnlyRootFilesystem": True}
    plain.kubectl("apply", "-f", "-", input=secured_pod(
        "root-read-only", f"id -u; echo x > {host_file} || echo refused; echo y > /work/z && echo wrote-volume",
        {}, as_root))
    log = finished(plain, "root-read-only")
    assert log.splitlines()[0] == "0" and "refused" in log and "wrote-volume" in log, log
    assert not host_file.exists()


def test_container_fields_override_the_pods_and_fs_group_owns_the_volumes(plain: FakeCluster) -> None:
    pod_context = {"runAsUser": 2000, "runAsGroup": 3000, "fsGroup": 4000, "supplementalGroups": [5000]}
    script = "id -u; id -g; id -G; stat -c '%g %a' /work; touch /work/f && stat -c '%g' /work/f"
    plain.kubectl("apply", "-f", "-", input=secured_pod("p", script, pod_context, {"runAsUser": 2500}))
    assert finished(plain, "p").split("\n")[:6] == ["2500", "3000", "3000 4000 5000", "4000 2777", "4000", ""]


def test_capabilities_are_the_runtimes_default_set_with_adds_and_drops(plain: FakeCluster) -> None:
    def bounding(name: str, context: dict[str, Any]) -> set[str]:
        plain.kubectl("apply", "-f", "-", input=secured_pod(name, "grep CapBnd /proc/self/status", {}, context))
        mask = int(finished(plain, name).split()[1], 16)
        return {cap for bit, cap in enumerate(CAPABILITIES) if mask >> bit & 1}

    assert bounding("default", {}) == set(RUNTIME_DEFAULT)
    assert bounding("ipc", {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}) == {"IPC_LOCK"}
    assert bounding("less", {"capabilities": {"drop": ["KILL", "CAP_CHOWN"]}}) == set(RUNTIME_DEFAULT) - {"KILL",
                                                                                                          "CHOWN"}


@pytest.mark.parametrize(("pod_context", "context", "reason", "words"), [
    ({"runAsNonRoot": True}, {}, "CreateContainerConfigError",
     "container has runAsNonRoot and image will run as root (pod: \"p_ml("),
    ({"runAsNonRoot": True}, {"runAsUser": 0}, "CreateContainerConfigError",
     "container's runAsUser breaks non-root policy (pod: \"p_ml("),
    ({"seLinuxOptions": {"level": "s0:c1,c2"}}, {}, "CreateContainerError",
     "fakekube cannot honour spec.securityContext.seLinuxOptions"),
    ({}, {"seccompProfile": {"type": "Localhost", "localhostProfile": "x.json"}}, "CreateContainerError",
     "fakekube cannot honour containers[main].securityContext.seccompProfile"),
])
def test_what_cannot_run_or_cannot_be_honoured_is_refused(plain: FakeCluster, pod_context: dict[str, Any],
                                                         context: dict[str, Any], reason: str, words: str) -> None:
    plain.kubectl("apply", "-f", "-", input=secured_pod("p", "echo ran", pod_context, context))
    state = waiting(plain, "p")
    assert state["reason"] == reason and words in state["message"], state
    assert (get_pod(plain, "p") or {})["status"]["phase"] == "Pending"
    events = plain.kubectl("get", "events", "-o", "json").stdout
    assert f"Error: {words}" in events.replace('\\"', '"')
    assert plain.kubectl("logs", "p").stdout == ""


def test_on_openshift_the_scc_gives_the_namespaces_uid_and_fs_group(cluster: FakeCluster) -> None:
    """restricted-v2: a pod that names no user runs as the first UID of its namespace's range with the first
    group of the supplemental range as its fsGroup (its volumes that group's); a user outside the range is
    refused at admission with OpenShift's words."""
    namespace = json.loads(cluster.kubectl("get", "namespace", "ml", "-o", "json").stdout)["metadata"]
    first = int(namespace["annotations"]["openshift.io/sa.scc.uid-range"].split("/")[0])
    group = int(namespace["annotations"]["openshift.io/sa.scc.supplemental-groups"].split("/")[0])
    script = "id -u; id -G; stat -c %g /work; grep CapBnd /proc/self/status; grep NoNewPrivs /proc/self/status"
    cluster.kubectl("apply", "-f", "-", input=secured_pod("p", script, {"runAsNonRoot": True}, {}))
    admitted = get_pod(cluster, "p") or {}
    assert admitted["metadata"]["annotations"]["openshift.io/scc"] == "restricted-v2"
    assert admitted["spec"]["containers"][0]["securityContext"]["runAsUser"] == first
    assert finished(cluster, "p").split() == [str(first), "0", str(group), str(group), "CapBnd:",
                                              "0000000000000000", "NoNewPrivs:", "1"]
    refused = cluster.kubectl("apply", "-f", "-", input=secured_pod("q", "id", {}, {"runAsUser": 1000}))
    assert refused.returncode == 1, refused
    assert (f'pods "q" is forbidden: unable to validate against any security context constraint: [provider '
            f'"restricted-v2": Forbidden: spec.containers[0].securityContext.runAsUser: Invalid value: 1000: must be '
            f"in the ranges: [{first}, {first + 9999}]]") in refused.stderr, refused.stderr


def test_a_secret_volume_as_the_kubelet_makes_it(cluster: FakeCluster) -> None:
    """A ``secret`` volume: one file per key with its value and ``defaultMode``; a missing optional Secret is an
    empty directory, a missing required one keeps the pod ContainerCreating (FailedMount)."""
    def with_secret(name: str, secret: str, optional: bool) -> str:
        document = yaml.safe_load(pod(name, "cat /s/TOKEN; ls -A /s | wc -l; stat -c %a /s/TOKEN; "
                                            "exec sleep infinity"))
        document["spec"]["volumes"].append({"name": "s", "secret": {"secretName": secret, "optional": optional,
                                                                     "defaultMode": 0o440}})
        document["spec"]["containers"][0]["volumeMounts"].append({"name": "s", "mountPath": "/s",
                                                                  "readOnly": True})
        return yaml.safe_dump(document)

    cluster.kubectl("create", "secret", "generic", "s", "--from-literal=TOKEN=t0k", "--from-literal=OTHER=x")
    cluster.kubectl("apply", "-f", "-", input=with_secret("a", "s", False))
    cluster.kubectl("apply", "-f", "-", input=with_secret("b", "absent", True))
    cluster.kubectl("apply", "-f", "-", input=with_secret("c", "absent", False))
    running(cluster, "a")
    running(cluster, "b")
    assert until(lambda: cluster.kubectl("logs", "a").stdout, "pod a's output") == "t0k2\n440\n"
    assert "0\n" in until(lambda: cluster.kubectl("logs", "b").stdout, "pod b's output")
    def mount_failed() -> dict[str, Any] | None:
        statuses = (get_pod(cluster, "c") or {}).get("status", {}).get("containerStatuses") or [{}]
        state = statuses[0].get("state", {}).get("waiting") or {}
        return state if "not found" in str(state.get("message")) else None

    state = until(mount_failed, "pod c's failed mount")
    assert state["reason"] == "ContainerCreating" and 'secret "absent" not found' in state["message"], state
