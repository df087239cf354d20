"""The Kubernetes backend end to end against pods that really run: fakekube from its command line with
``--run-pods``, the real kubectl (WebSocket exec, logs -f) and the real ``mlenv``: deploy, status, exec, sync
(rsync over kubectl exec), a 2x2 torchrun/gloo job, logs, stop and clean."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import MLENV, ROOT
from tests.integration.kube_pods import (  # noqa: F401 - kube_project is a fixture
    APP,
    KubeProject,
    kube_cluster,
    kube_project,
    pod_processes,
)

ALLREDUCE_JOB = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} on node {os.environ['MLENV_NODE_RANK']}: world {dist.get_world_size()} "
      f"sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
"""
RESULT = re.compile(r"^\[node-(\d) r(\d)\] rank \2 on node \1: world 4 sum 4$", re.MULTILINE)
"""A rank's line as the node supervisor tags it: ``[node-N rR] ...``."""


@pytest.mark.parametrize("kube_project", ["kubernetes", "runai"], indirect=True)
def test_deploy_sync_exec_torchrun_clean(kube_project: KubeProject) -> None:  # noqa: F811 - fixture
    project = kube_project
    project.ok("deploy", str(project.cluster_file))
    pods = json.loads(project.ok("status", "--json").stdout)["pods"]
    assert [(p["phase"], p["ready"]) for p in pods] == [("Running", True)] * 2, pods

    source = project.home / "workspace"
    source.mkdir()
    (source / "allreduce.py").write_text(ALLREDUCE_JOB)
    project.ok("sync", "--source", str(source))
    for ordinal, pod in enumerate(pods):
        answer = project.ok("exec", "--pod", str(ordinal), "--", "sh", "-c",
                            'echo "$(hostname) $(pwd) $MLENV_NODE_RANK"; ls')
        assert f"{pod['pod']} /workspace {ordinal}" in answer.stdout, answer.stdout
        assert "allreduce.py" in answer.stdout, answer.stdout

    launched = project.ok("launch", "--launcher", "torchrun", "allreduce.py", timeout=300)
    ranks = {(int(node), int(rank)) for node, rank in RESULT.findall(launched.stdout)}
    assert sorted(rank for _, rank in ranks) == [0, 1, 2, 3], launched.stdout + launched.stderr
    assert {node for node, _ in ranks} == {0, 1}  # two ranks on each pod

    project.ok("clean")
    assert not pod_processes(project.pods_root)


def test_a_user_id_of_the_cluster_file_runs_sync_exec_and_the_job_as_that_user(tmp_path: Path) -> None:
    """``security.run_as_user`` on plain Kubernetes: the pods really run as that user, which can write its
    workspace (the claim is root's until the pod's fsGroup makes it the user's group's); the job's files are its."""
    with kube_cluster(tmp_path, "kubernetes", "security:\n  run_as_user: 1000\n") as project:
        project.ok("deploy", str(project.cluster_file))
        source = project.home / "workspace"
        source.mkdir()
        (source / "allreduce.py").write_text(ALLREDUCE_JOB + "open(f'/workspace/out-{os.environ[\"RANK\"]}', 'w')\n")
        project.ok("sync", "--source", str(source))
        answer = project.ok("exec", "--pod", "0", "--", "sh", "-c", "id -u; id -G; stat -c '%g %A' /workspace")
        assert answer.stdout.splitlines() == ["[node-0] 1000", "[node-0] 0 1000", "[node-0] 1000 drwxrwsr-x"], answer
        launched = project.ok("launch", "--launcher", "torchrun", "allreduce.py", timeout=300)
        assert len(RESULT.findall(launched.stdout)) == 4, launched.stdout + launched.stderr
        owners = project.ok("exec", "--pod", "0", "--", "sh", "-c", "stat -c '%u %g' /workspace/out-*")
        assert owners.stdout.splitlines() == ["[node-0] 1000 1000"] * 2, owners.stdout
        project.ok("clean")


TRAPPING_JOB = """\
import os, signal, sys, time
from pathlib import Path

me = f"{os.environ['MLENV_NODE_RANK']}-{os.environ['LOCAL_RANK']}"

def stop(signum, frame):
    Path(f"/workspace/stopped-{me}").write_text(signal.Signals(signum).name)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
Path(f"/workspace/started-{me}").write_text(f"attempt{os.environ['MLENV_RESTART_COUNT']}")
print(f"rank {me} started", flush=True)
while True:
    time.sleep(0.1)
"""


def _until(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _files(project: KubeProject, ordinal: int, pattern: str) -> str:
    found = project.kubectl("exec", f"{APP}-{ordinal}", "--", "sh", "-c", f"cd /workspace && cat {pattern}")
    return found.stdout


def test_deleting_a_pod_under_a_running_job_gives_its_ranks_sigterm(kube_project: KubeProject) -> None:  # noqa: F811
    project = kube_project
    project.cluster_file.write_text(project.cluster_file.read_text() + "scheduling:\n  grace_period: 5m\n")
    project.ok("deploy", str(project.cluster_file))
    grace = project.kubectl("get", "sts", APP, "-o", "jsonpath={.spec.template.spec.terminationGracePeriodSeconds}")
    assert grace.stdout == "300"
    init = project.kubectl("exec", f"{APP}-1", "--", "cat", "/proc/1/cmdline").stdout
    assert init.startswith("python3\x00-c\x00")  # PID 1 is the init, with the grace and its mark of a preemption
    assert init.endswith("\x00300\x00/dev/shm/mlenv-pod-taken-away\x00"), init[-60:]

    source = project.home / "workspace"
    source.mkdir()
    (source / "trap.py").write_text(TRAPPING_JOB)
    project.ok("sync", "--source", str(source))
    project.ok("launch", "--detach", "--launcher", "torchrun", "trap.py")
    follow = subprocess.Popen([str(MLENV), "logs", "-f", "--pod", "1"], cwd=ROOT, env=project.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert follow.stdout is not None
        seen = next((line for line in follow.stdout if line.startswith("[node-1 r") and " started" in line), "")
        assert seen.startswith("[node-1 r") and "rank 1-" in seen, seen  # the run's log, tagged by rank
    finally:
        follow.terminate()
        follow.wait(timeout=30)
    _until(lambda: _files(project, 1, "started-1-*") == "attempt0attempt0", "both ranks of pod 1 started")

    started = time.monotonic()
    deleted = project.kubectl("delete", "pod", f"{APP}-1", timeout=400)
    took = time.monotonic() - started
    assert deleted.returncode == 0, deleted.stderr
    assert took < 60, f"the pod took {took:.0f}s to go: its ranks did not get SIGTERM before the 300s SIGKILL"
    _until(lambda: all(p["ready"] for p in json.loads(project.ok("status", "--json").stdout)["pods"]), "pod 1 back")
    assert _files(project, 1, "stopped-1-*") == "SIGTERMSIGTERM"  # its volume kept what the ranks wrote
    # not failed, not a user's stop: a detached run resumes once the pod is back
    _until(lambda: _files(project, 0, "started-0-*") + _files(project, 1, "started-1-*") == "attempt1" * 4,
           "every rank of the run resumed in attempt 1")
    assert json.loads(project.ok("status", "--json").stdout)["latest_run"]["attempt"] == 1
    ended = _files(project, 1, ".mlenv/runs/*/attempt-0/node1/state.json")
    assert json.loads(ended)["state"] == "preempted", ended  # the nodes' records
    project.kubectl("exec", f"{APP}-0", "--", "sh", "-c", "rm /workspace/stopped-0-*")  # attempt 0's
    project.ok("stop")
    _until(lambda: _files(project, 0, "stopped-0-*") == "SIGTERMSIGTERM", "pod 0's ranks stopped")
    project.ok("clean")
    assert not pod_processes(project.pods_root)


def test_exec_into_a_pod_whose_container_is_not_running(kube_project: KubeProject) -> None:  # noqa: F811
    project = kube_project
    project.ok("deploy", str(project.cluster_file))
    pod = f"{APP}-1"
    for restarts in (1, 2):  # PID 1 (the init) ends on SIGTERM; the second time the kubelet backs off 30 s
        project.kubectl("exec", pod, "--", "kill", "1")
        _until(lambda wanted=restarts: f'"restartCount":{wanted}' in project.kubectl(
            "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0]}").stdout, f"restart {restarts}")
    status = json.loads(project.ok("status", "--json").stdout)["pods"]
    assert "CrashLoopBackOff" in (status[1]["detail"] or "") and "exit code 0" in status[1]["detail"], status
    refused = project.mlenv("exec", "--pod", "1", "--", "true")
    assert refused.returncode != 0
    assert 'container not found ("ml-dev")' in refused.stdout  # kubectl's own words, as the node's output
    assert f"node-1 ({pod}): exit status 1" in refused.stderr
    answered = project.mlenv("exec", "--pod", "0", "--", "true")
    assert answered.returncode == 0, answered.stderr


@pytest.mark.parametrize("kube_project", ["kubernetes", "runai"], indirect=True)
def test_stacks_and_gpu_state_through_kubectl_exec(kube_project: KubeProject) -> None:  # noqa: F811 - fixture
    from tests.integration.test_stacks import hanging_job, until_grouped

    project = kube_project
    project.ok("deploy", str(project.cluster_file))
    source = project.home / "workspace"
    source.mkdir()
    (source / "hang.py").write_text(hanging_job("stuck_in_a_pod", 2))
    project.ok("sync", "--source", str(source))
    report = json.loads(project.ok("status", "--gpus", "--json").stdout)
    states = report["gpu_state"]
    assert [(s["node"], s["pod"]) for s in states] == [(n, p["pod"]) for n, p in enumerate(report["pods"])], states
    assert all("gpus" in s for s in states), states  # every pod answered (no nvidia-smi there: named in errors)
    project.ok("launch", "--launcher", "torchrun", "--detach", "hang.py")
    until_grouped(lambda: project.mlenv("stacks", "--json", timeout=120), 2, "stuck_in_a_pod", 180)
    project.ok("stop")
    project.ok("clean")
    assert not pod_processes(project.pods_root)
