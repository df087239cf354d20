"""A pod taken away under a run (``kubectl delete pod``, or evicted by ``kubectl drain`` of its node, as
a preemption does) is not a failure: its ranks get the checkpoint signal (the pod's PID 1 passes SIGTERM on), mlenv
says the run was preempted, waits until the pod is back and resumes the run as its next attempt, with
MLENV_RESTART_COUNT=1 and the same MLENV_CHECKPOINT_DIR, without --max-restarts; a detached run resumes on its own
(the nodes still there start the next attempt, the pod that comes back joins it). End to end against pods that
really run (fakekube ``--run-pods``). ``mlenv drill --fault preempt`` deletes pod 1 under its job and times each
phase, the preempted pod's checkpoint on SIGTERM within half the pods' grace among them."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable

import pytest

from tests.helpers import MLENV, ROOT
from tests.integration.kube_pods import APP, KubeProject, kube_project  # noqa: F401 - kube_project is a fixture
from tests.integration.test_drill import check_drill

CHECKPOINTS = """\
import os, pathlib, signal, sys, time
rank, attempt = os.environ["RANK"], os.environ["MLENV_RESTART_COUNT"]
checkpoints = pathlib.Path(os.environ["MLENV_CHECKPOINT_DIR"])
checkpoints.mkdir(parents=True, exist_ok=True)
if attempt != "0":
    saved = sorted(path.name for path in checkpoints.iterdir())
    print(f"rank {rank} resumed in attempt {attempt} from {checkpoints}: {' '.join(saved)}", flush=True)
    sys.exit(0)

def checkpoint(signum, frame):
    (checkpoints / f"rank-{rank}").write_text(signal.Signals(signum).name)
    sys.exit(143)

signal.signal(getattr(signal, os.environ["MLENV_CHECKPOINT_SIGNAL"]), checkpoint)  # SIGTERM here
pathlib.Path(f"started-{rank}").write_text(str(checkpoints))
print(f"rank {rank} training in attempt {attempt}", flush=True)
while True:
    time.sleep(0.1)
"""


def _started(project: KubeProject) -> list[str]:
    """The ranks' start files in pod 1's workspace (its own volume)."""
    found = project.kubectl("exec", f"{APP}-1", "--", "sh", "-c", "cd /workspace && ls started-* 2>/dev/null; true")
    return found.stdout.split()


def _deployed(project: KubeProject) -> KubeProject:
    """``project`` deployed, with the checkpointing job synced."""
    project.ok("deploy", str(project.cluster_file))
    source = project.home / "workspace"
    source.mkdir()
    (source / "job.py").write_text(CHECKPOINTS)
    project.ok("sync", "--source", str(source))
    return project


def _delete(project: KubeProject) -> subprocess.CompletedProcess[str]:
    """``kubectl delete pod`` of pod 1, not waiting for it to go."""
    return project.kubectl("delete", "pod", f"{APP}-1", "--wait=false")


def _drain(project: KubeProject) -> subprocess.CompletedProcess[str]:
    """``kubectl drain`` of pod 1's Kubernetes node: cordoned, the pod evicted (pods/eviction), gracefully."""
    node = project.kubectl("get", "pod", f"{APP}-1", "-o", "jsonpath={.spec.nodeName}").stdout
    return project.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s",
                           timeout=180)


@pytest.mark.parametrize("take_away", [_delete, _drain], ids=["delete-pod", "drain-node"])
def test_a_pod_taken_away_preempts_the_run_which_resumes_from_its_checkpoint(
    take_away: Callable[[KubeProject], subprocess.CompletedProcess[str]], kube_project: KubeProject  # noqa: F811
) -> None:
    project = _deployed(kube_project)

    run = subprocess.Popen([str(MLENV), "launch", "--launcher", "torchrun", "job.py"], cwd=ROOT, env=project.env,
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _started(project) != ["started-2", "started-3"]:  # both ranks of pod 1 train
            assert time.monotonic() < deadline and run.poll() is None, "the ranks of pod 1 did not start"
            time.sleep(0.3)
        checkpoints = project.kubectl("exec", f"{APP}-1", "--", "cat", "/workspace/started-2").stdout
        taken = take_away(project)
        assert taken.returncode == 0, taken.stderr
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert re.search(r"run \S+ preempted: node-1 \(\S+\) taken away under it \(deleted or evicted\); resuming it as "
                     r"attempt 1 once they are back", err), err
    resumed = re.findall(r"rank (\d) resumed in attempt 1 from (\S+): (.*)$", out, re.MULTILINE)
    assert sorted(rank for rank, _, _ in resumed) == ["0", "1", "2", "3"], out
    assert {where for _, where, _ in resumed} == {checkpoints}  # the same checkpoint directory
    saved = {rank: set(names.split()) for rank, _, names in resumed}  # each pod's volume: its own ranks' checkpoints
    assert saved["2"] == saved["3"] == {"rank-2", "rank-3"}, out  # the preempted pod's ranks got the signal
    signals = project.kubectl("exec", f"{APP}-1", "--", "sh", "-c", f"cat {checkpoints}/rank-2 {checkpoints}/rank-3")
    assert signals.stdout == "SIGTERMSIGTERM", signals.stdout + signals.stderr
    assert "restarting it" not in err and "failed with exit code" not in err  # a resumption, not a failure
    [latest] = json.loads(project.ok("status", "--json").stdout)["runs"][-1:]
    assert latest["preemptions"] == 1, latest


def test_a_detached_run_resumes_on_its_own_once_the_pod_is_back(kube_project: KubeProject) -> None:  # noqa: F811
    """Detached, no terminal waiting: pod 1's supervisors record the attempt preempted; pod 0's supervisors start
    attempt 1 at once and wait for it in the rendezvous; the recreated pod's PID 1 has the runtime resume pod 1's
    share (the run's Secret names the run and holds its control secret). Every rank resumes from the same
    checkpoint directory with MLENV_RESTART_COUNT=1, and the run succeeds."""
    project = _deployed(kube_project)
    run_id = json.loads(project.ok("launch", "--launcher", "torchrun", "--detach", "--json", "job.py").stdout)["run_id"]
    secret = json.loads(project.kubectl("get", "secret", f"{APP}-run", "-o", "json").stdout)
    assert set(secret["data"]) == {"MLENV_CONTROL_SECRET", "MLENV_RESUME_RUN"}, secret["data"]
    deadline = time.monotonic() + 120
    while _started(project) != ["started-2", "started-3"]:
        assert time.monotonic() < deadline, "the ranks of pod 1 did not start"
        time.sleep(0.3)
    checkpoints = project.kubectl("exec", f"{APP}-1", "--", "cat", "/workspace/started-2").stdout
    assert _delete(project).returncode == 0
    deadline = time.monotonic() + 240
    run: dict[str, object] = {}
    while (run.get("attempt"), run.get("state")) != (1, "succeeded"):
        assert time.monotonic() < deadline, run
        time.sleep(1)
        run = json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}
    shown = project.ok("logs", run_id).stdout
    resumed = re.findall(r"rank (\d) resumed in attempt 1 from (\S+): (.*)$", shown, re.MULTILINE)
    assert sorted(rank for rank, _, _ in resumed) == ["0", "1", "2", "3"], shown
    assert {where for _, where, _ in resumed} == {checkpoints}, shown  # the same checkpoint directory
    saved = {rank: set(names.split()) for rank, _, names in resumed}
    assert saved["2"] == saved["3"] == {"rank-2", "rank-3"}, shown  # the preempted pod's ranks saved theirs
    assert run["preemptions"] == 1, run  # a resumption, not a restart
    said = project.ok("status").stdout
    assert "(restarted 0x, preempted 1x" in said, said
    node1 = project.kubectl("exec", f"{APP}-1", "--", "sh", "-c",
                            f"cat /workspace/.mlenv/runs/{run_id}/attempt-0/node1/state.json").stdout
    assert json.loads(node1)["state"] == "preempted", node1


def test_the_drill_preempts_a_pod_and_times_its_checkpoint_and_the_resumption(
        kube_project: KubeProject) -> None:  # noqa: F811
    kube_project.ok("deploy", str(kube_project.cluster_file))
    drill = check_drill(kube_project, "preempt")
    detected, checkpointed = drill["phases"][:2]
    assert detected["evidence"] == f"pod {APP}-1 deleted (grace 30 s): recorded preempted on node-0, node-1"
    assert re.fullmatch(r"node 1 checkpointed step \d+ after SIGTERM", checkpointed["evidence"]), checkpointed
    assert checkpointed["target"] == 15.0  # half the pod's grace (scheduling.grace_period, 30 s by default)
