"""End to end on the local backend with network namespaces (root): deploy -> status -> exec -> sync ->
torchrun 2x2 -> logs under runs/ -> fail-fast -> clean leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.backends.local.backend import LocalBackend
from mlenv.core.capabilities import Handle, Request
from mlenv.parallel import warning_said

from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import (
    DONE,
    FAILING_JOB,
    TINY_JOB,
    LocalProject,
    leftovers,
    make_project,
    require_local,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2-pod namespaces cluster with the tiny jobs synced; cleaned (with data) afterwards."""
    require_local("namespaces")
    project = make_project(tmp_path_factory.mktemp("ns"), "lns", "10.77.61.0/24", "namespaces")
    project.ok("deploy", project.name)
    source = project.source({"tiny.py": TINY_JOB, "fail.py": FAILING_JOB})
    project.ok("sync", "--cluster", project.name, "--source", str(source))
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def test_pods_have_own_address_nic_hosts_and_hostname(cluster: LocalProject) -> None:
    pods = cluster.status()
    assert [p["extra"]["nic"] for p in pods] == ["ens1f1", "ens1f0np0"]
    assert [p["ip"] for p in pods] == ["10.77.61.2", "10.77.61.3"]
    assert {p["extra"]["mode"] for p in pods} == {"namespaces"} and all(p["ready"] for p in pods)
    master = f"{cluster.app}-0.{cluster.app}-headless.{cluster.name}-ns.svc.cluster.local"
    out = cluster.ok("exec", "--cluster", cluster.name, "--", "sh", "-c",
                     f'ls /sys/class/net | tr "\\n" " "; getent hosts {master}; pwd; echo host=$(hostname) '
                     f'$(getent hosts $(hostname) | cut -d" " -f1); echo rank=$MLENV_NODE_RANK').stdout
    node0 = [line for line in out.splitlines() if line.startswith("[node-0]")]
    node1 = [line for line in out.splitlines() if line.startswith("[node-1]")]
    assert "ens1f1" in node0[0] and "ens1f0np0" in node1[0] and "eth0" not in out
    assert all(any(f"10.77.61.2 {master}" in " ".join(line.split()) for line in lines) for lines in (node0, node1))
    assert node0[-1] == "[node-0] rank=0" and node1[-1] == "[node-1] rank=1"
    assert [node0[-2], node1[-2]] == [f"[node-{n}] host={cluster.app}-{n} 10.77.61.{n + 2}" for n in (0, 1)]  # UTS
    assert str(cluster.pod_dir(1) / "workspace") in "\n".join(node1)


def test_redeploy_converges_and_repairs_leftovers(cluster: LocalProject) -> None:
    broken = str(cluster.status()[1]["host"])  # a pod's node is its network namespace
    subprocess.run(["ip", "netns", "delete", broken], check=True)  # as if a crash broke it
    assert [p["phase"] for p in cluster.status()] == ["Running", "Broken"]
    cluster.ok("deploy", cluster.name)
    cluster.ok("deploy", cluster.name)
    assert all(p["ready"] for p in cluster.status())


def test_torchrun_job_rendezvous_across_nics_and_logs(cluster: LocalProject) -> None:
    result = cluster.ok("launch", "--cluster", cluster.name, "--launcher", "torchrun", "tiny.py", timeout=90)
    done = DONE.search(result.stdout)
    assert done is not None, result.stdout
    assert re.search(rf"^\[node-{done.group(1)} r\d\] step 3/3", result.stdout, re.MULTILINE)
    runs = list((cluster.home / "runs").glob(f"*-{cluster.name}"))
    assert len(runs) == 1
    assert "done world_size=4" in (runs[0] / f"node-{done.group(1)}.log").read_text()
    assert "node 0/2" in (runs[0] / "node-0.log").read_text() and "node 1/2" in (runs[0] / "node-1.log").read_text()
    logged = "".join((runs[0] / f"node-{n}.log").read_text() for n in (0, 1))
    for warning in {said for line in logged.splitlines() if (said := warning_said(line))}:  # torch's c10d ones
        assert sum(warning_said(line) == warning for line in result.stdout.splitlines()) == 1, warning


def _launch_until(cluster: LocalProject, marker: str, *args: str,
                  times: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
    """Start `mlenv launch ... fail.py ARGS` and read its output up to the ``times``-th line containing ``marker``."""
    process = subprocess.Popen([str(MLENV), "launch", "--cluster", cluster.name, "--launcher", "torchrun",
                                "fail.py", *args], cwd=ROOT, env={**os.environ, "MLENV_HOME": str(cluster.home)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    output = []
    for line in process.stdout:
        output.append(line)
        if sum(marker in seen for seen in output) == times:
            break
    return process, output


def _finish(process: subprocess.Popen[str], output: list[str], within: float) -> tuple[int, str]:
    """Exit code and whole output of ``process``, which must end within ``within`` seconds from now."""
    started = time.monotonic()
    assert process.stdout is not None
    output += process.stdout.readlines()
    code = process.wait(timeout=60)
    assert time.monotonic() - started < within, "".join(output)
    return code, "".join(output)


def _processes(cluster: LocalProject) -> list[str]:
    return [item for item in leftovers(cluster) if item.startswith("process")]


def test_another_checkout_of_the_same_app_never_touches_these_pods(cluster: LocalProject,
                                                                   tmp_path: Path) -> None:
    twin = make_project(tmp_path, cluster.name, "10.77.61.0/24", "namespaces")  # same app, same subnet
    twin.ok("deploy", twin.name)
    try:
        assert {p["host"] for p in twin.status()}.isdisjoint(p["host"] for p in cluster.status())
    finally:
        twin.ok("clean", "--cluster", twin.name, "--delete-data", "--yes")
    assert all(p["ready"] for p in cluster.status())
    assert cluster.ok("exec", "--cluster", cluster.name, "--pod", "1", "--", "head", "-1", "tiny.py").stdout == (
        "[node-1] import os, sys\n")


def test_fail_fast_stops_every_node(cluster: LocalProject) -> None:
    process, output = _launch_until(cluster, "failing on purpose", "--fail")
    code, text = _finish(process, output, within=10)
    assert code == 3, text  # the failing rank's own code
    assert re.search(r"mlenv: rank [23] \(node-1, pid \d+\) exited with 3 first; last lines: failing on purpose", text)
    closing = text[text.index("error: node-1 failed with exit code 3; the other nodes were stopped."):]
    assert re.match(r"error: node-1 failed with exit code 3; the other nodes were stopped\. Rank [23] \(\S+\) exited "
                    r"with 3 first; its last lines \(the node's whole log: \S+/node-1\.log\):\n", closing), closing
    assert "failing on purpose" in closing and "Traceback" not in closing  # the rank's words, not torchrun's teardown
    assert _processes(cluster) == []
    after = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)  # one wording, every time
    assert after["run_states"] == {"0": "stopped (143)", "1": "failed (3)"}, after
    assert after["latest_run"]["state"] == "failed" and after["latest_run"]["exit_code"] == 3, after
    assert [p["extra"]["jobs"] for p in cluster.status()] == [0, 0]


def test_interrupt_stops_every_node(cluster: LocalProject) -> None:
    process, output = _launch_until(cluster, "sleeping", times=4)  # every rank of 2 nodes x 2 is in its sleep
    process.send_signal(signal.SIGINT)
    code, text = _finish(process, output, within=10)
    assert code == 130 and "interrupted: every node stopped" in text, text
    assert _processes(cluster) == []


def test_logs_show_the_latest_run_of_each_pod(cluster: LocalProject) -> None:
    out = cluster.ok("logs", "--cluster", cluster.name, "--pod", "1").stdout  # the interrupted fail.py run
    # torchrun's own words for the stop: it got SIGTERM once, so its log line is whole (a second one cut it short)
    assert "sleeping" in out and "Received 15 death signal" in out, out
    assert all(line.startswith(("[node-1] ", "[node-1 r")) for line in out.splitlines())
    assert cluster.mlenv("logs", "--cluster", cluster.name, "--pod", "7").returncode == 2


def test_detached_job_status_logs_follow_and_stop(cluster: LocalProject) -> None:
    started = cluster.ok("launch", "--cluster", cluster.name, "--launcher", "torchrun", "--detach", "fail.py")
    assert "started in the background: mlenv logs -f follows it, mlenv stop stops it" in started.stderr
    assert started.stdout.count("started in the background: pid") == 2  # one line per node, then launch returned
    follow = subprocess.Popen([str(MLENV), "logs", "--cluster", cluster.name, "--follow"], cwd=ROOT,
                              env={**os.environ, "MLENV_HOME": str(cluster.home)}, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, follow.kill)  # a hung follow fails the test instead of hanging it
    watchdog.start()
    try:
        deadline = time.monotonic() + 60
        report = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
        while report.get("run_states") != {"0": "running", "1": "running"} and time.monotonic() < deadline:
            time.sleep(0.5)
            report = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
        assert report["run_states"] == {"0": "running", "1": "running"}, report
        assert report["runs"][-1]["script"] == "fail.py"
        assert "running on 2/2 nodes" in cluster.ok("status", "--cluster", cluster.name).stdout
        assert follow.stdout is not None
        seen: list[str] = []
        # every rank of both nodes reached its sleep, each line whole and tagged
        while sum(bool(re.fullmatch(r"\[node-\d r\d\] sleeping\n", line)) for line in seen) < 4:
            line = follow.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
        assert follow.poll() is None  # still following the running job
        stopped = cluster.ok("stop", "--cluster", cluster.name)
        assert stopped.stdout.count(": ended after SIGTERM") == 2, stopped.stdout
        out, _ = follow.communicate(timeout=30)  # logs -f ends with the job
    finally:
        watchdog.cancel()
        follow.kill()
    assert "Received 15 death signal" in out
    assert _processes(cluster) == []
    after = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
    assert set(after["run_states"].values()) == {"stopped (143)"}, after
    assert after["latest_run"]["state"] == "stopped" and after["latest_run"]["first_failure"] is None
    assert cluster.ok("stop", "--cluster", cluster.name).stdout.count("nothing to stop") == 2


def test_clean_leaves_nothing_and_twice_is_fine(cluster: LocalProject) -> None:
    sleeper = cluster.mlenv("exec", "--cluster", cluster.name, "--pod", "0", "--", "sh", "-c",
                            "sleep 300 >/dev/null 2>&1 &")
    assert sleeper.returncode == 0
    assert [p["extra"]["jobs"] for p in cluster.status()] == [0, 0]  # the exec itself ended
    assert any(item.startswith("process") for item in leftovers(cluster))  # but the sleep runs in the pod
    cluster.ok("clean", "--cluster", cluster.name)
    assert (cluster.pod_dir(0) / "workspace" / "tiny.py").is_file()  # data kept without --delete-data
    cluster.ok("clean", "--cluster", cluster.name, "--delete-data", "--yes")
    cluster.ok("clean", "--cluster", cluster.name, "--delete-data", "--yes")
    assert leftovers(cluster) == []
    assert json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)["pods"] == []


def _namespaces_from(prefix: str) -> list[str]:
    """The network namespaces (in /run/netns, where ``ip netns`` keeps them; its text listing prints a name with a
    newline as two) and /etc/netns entries whose names start with ``prefix``."""
    return [f"{directory}/{name}" for directory in ("/run/netns", "/etc/netns") if os.path.isdir(directory)
            for name in os.listdir(directory) if name.startswith(prefix)]


def test_clean_removes_the_namespaces_of_an_app_name_with_a_newline(tmp_path: Path) -> None:
    """A deployment recorded before names were matched whole (app "odd\\n app"): clean removes its bridge, pods and
    /etc/netns entries all the same."""
    require_local("namespaces")
    app, owner = "odd\n app", "0dd0dd00"
    prefix = f"mlenv-{app}-{owner}-"
    pods = [{"ordinal": n, "name": f"{app}-{n}", "mode": "namespaces", "ip": f"10.77.62.{n + 2}", "nic": "eth0",
             "netns": f"{prefix}{n}", "prefixlen": 24, "master_port": 29500} for n in (0, 1)]
    data = {"base": str(tmp_path / "pods"), "app": app, "owner": owner, "namespace": "odd", "pods": pods}
    handle = Handle("local", "odd", 2, "tcp", False, {}, data)
    backend = LocalBackend(project=tmp_path, namespaces_available=True)
    try:
        backend.apply(Request(handle, "", {}), lambda _: None)
        made = [f"/run/netns/{prefix}{name}" for name in ("0", "1", "br")] + [f"/etc/netns/{prefix}{n}" for n in "01"]
        assert sorted(_namespaces_from(prefix)) == sorted(made)
        backend.apply(Request(handle, "", {}), lambda _: None)  # deploying again finds them: nothing to make
        assert sorted(_namespaces_from(prefix)) == sorted(made)
        backend.clean(handle, delete_data=True)
        assert _namespaces_from(prefix) == []
        assert not (tmp_path / "pods").exists()
    finally:
        for path in _namespaces_from(prefix):
            if path.startswith("/run/"):
                subprocess.run(["ip", "netns", "delete", os.path.basename(path)], check=False)
            else:
                shutil.rmtree(path, ignore_errors=True)
