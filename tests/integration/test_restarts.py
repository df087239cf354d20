"""``mlenv launch --max-restarts N`` on a local cluster (processes): a run that fails is started again, attached,
with the same MLENV_RUN_ID and MLENV_RESTART_COUNT the attempt, its attempts under runs/<id>/attempt-K/; it stops
at N restarts with the last attempt's exit code; the cluster file's launch.max_restarts is the default; bad counts
are bad input (exit 2), through the CLI, the cluster file and make."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MLENV, ROOT, launch_said
from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.integration.test_makefile import make

# No torch: until the attempt named by --until (exclusive), the first rank of one node fails: node --bad-node, or
# else node 0 then node 1 in turn (so that no node fails first twice); everyone says who they are.
FLAKY_JOB = """\
import os, sys
attempt, until = int(os.environ["MLENV_RESTART_COUNT"]), int(sys.argv[2])
failing = sys.argv[4] if sys.argv[3:4] == ["--bad-node"] else str(attempt % 2)
node, local = os.environ["MLENV_NODE_RANK"], os.environ["LOCAL_RANK"]
os.chdir("/")  # as Hydra's job.chdir does: the checkpoints must not move with it
checkpoints = os.environ["MLENV_CHECKPOINT_DIR"]
os.makedirs(checkpoints, exist_ok=True)
mark = os.path.join(checkpoints, f"node{node}-local{local}")
resumed = os.path.exists(mark)
open(mark, "w").close()
print(f"attempt {attempt} of run {os.environ['MLENV_RUN_ID']} on node {node} rank {os.environ['RANK']} "
      f"checkpoints {checkpoints} local {local} resumed {resumed}", flush=True)
if node == failing and local == "0" and attempt < until:
    print("failing on purpose", flush=True)
    sys.exit(3)
if sys.argv[-1] == "--sleep":
    import time
    print("sleeping", flush=True)
    time.sleep(600)
"""


# No torch: each attempt K does step K of the comma-separated plan (its last step from then on); everyone says who
# they are. ok: NCCL's lines of an IB network (one rank a node), exit 0. contradict: NCCL's lines of sockets, then
# wait to be stopped. hang, sleep: wait silently. late-fail-N: the other node's ranks exit 0 first, then node N's
# rank 0 fails (it waits until their processes are gone, seen through pid files under MARKS). netfail-N: node N's
# rank 0 prints an NCCL network error and fails. stop-race: node 0's ranks wait; node 1's rank 0 fails once they are
# gone (as a rank does of its peers' death), its rank 1 waits. lose-N: node N's rank 0 kills its node's supervisor
# (SIGKILL) and fails.
NET_ERROR = ("n1:88:102 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<33092> "
             "with error 12, opcode 0, len 0, vendor err 129 (Recv)")
PLAN_JOB = f"""\
import os, sys, time
attempt, marks = int(os.environ["MLENV_RESTART_COUNT"]), sys.argv[2]
steps = sys.argv[1].split(",")
step = steps[min(attempt, len(steps) - 1)]
node, local = os.environ["MLENV_NODE_RANK"], os.environ["LOCAL_RANK"]
print(f"attempt {{attempt}} of run {{os.environ['MLENV_RUN_ID']}} on node {{node}} rank {{os.environ['RANK']}}: "
      f"{{step}}", flush=True)
network = {{"ok": "IB", "contradict": "Socket"}}.get(step)
if network and local == "0":
    using = "NET/IB : Using [0]mlx5_0:1/IB" if network == "IB" else "NET/Socket : Using [0]eth0:10.0.0.5<0>"
    print(f"n{{node}}:{{os.getpid()}}:7 [0] NCCL INFO {{using}}", flush=True)  # as NCCL in this process prints it
    print(f"n{{node}}:{{os.getpid()}}:7 [0] NCCL INFO Using network {{network}}", flush=True)
if step in ("contradict", "hang", "sleep"):
    time.sleep(600)
if step.startswith("late-fail-") or step == "stop-race":
    here = os.path.join(marks, str(attempt))
    os.makedirs(here, exist_ok=True)
    if node != ("1" if step == "stop-race" else step[-1]):
        with open(os.path.join(here, f"{{node}}-{{local}}"), "w") as mark:
            mark.write(str(os.getpid()))
        if step == "stop-race":
            time.sleep(600)
        sys.exit(0)
    if local != "0" and step == "stop-race":
        time.sleep(600)
    if local == "0":
        deadline = time.monotonic() + 120
        while len(os.listdir(here)) < 2 or any(os.path.exists(f"/proc/{{open(os.path.join(here, n)).read()}}")
                                               for n in os.listdir(here)):
            if time.monotonic() > deadline:
                sys.exit(4)
            time.sleep(0.1)
        print("failing after the other node's ranks succeeded", flush=True)
        sys.exit(3)
if step.startswith("lose-") and node == step[-1] and local == "0":
    import json, signal
    with open(os.environ["MLENV_JOB"]) as record:  # the supervisor's record.json
        os.kill(json.load(record)["pid"], signal.SIGKILL)
    sys.exit(3)
if step.startswith("netfail-") and node == step[-1] and local == "0":
    print({NET_ERROR!r}, flush=True)
    sys.exit(3)
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (processes) holding flaky.py and plan.py."""
    require_local("processes")
    made = make_project(tmp_path, "lrst", "10.77.68.0/24", "processes")
    made.ok("deploy", made.name)
    made.ok("sync", "--source", str(made.source({"flaky.py": FLAKY_JOB, "plan.py": PLAN_JOB})))
    yield made
    made.mlenv("clean", "--cluster", made.name, "--delete-data", "--yes")


def attempts(output: str) -> set[tuple[int, str, int]]:
    """(attempt, run id, rank) of every rank's first line."""
    return {(int(m[1]), m[2], int(m[3])) for m in re.finditer(r"attempt (\d) of run (\S+) on node \d rank (\d)",
                                                              output)}


def test_a_failed_run_is_restarted_until_it_succeeds(project: LocalProject) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "3", "flaky.py", "--until", "2",
                           timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = attempts(result.stdout)  # a failed attempt's stop may end a rank before it said who it is
    assert {attempt for attempt, _, _ in seen} == {0, 1, 2}, result.stdout
    assert sorted(rank for attempt, _, rank in seen if attempt == 2) == [0, 1, 2, 3], result.stdout
    (run_id,) = {run for _, run, _ in seen}  # the same MLENV_RUN_ID every time
    # and checkpoints: absolute, each node's the same in every attempt, so a script that changes directory resumes
    found = re.findall(r"attempt (\d) of run \S+ on node (\d) rank \d checkpoints (\S+) local (\d) resumed (\w+)",
                       result.stdout)
    assert {int(attempt) for attempt, _, _, _, _ in found} == {0, 1, 2}, result.stdout
    for node in ("0", "1"):
        (checkpoints,) = {path for _, n, path, _, _ in found if n == node}
        assert os.path.isabs(checkpoints) and checkpoints.endswith(f"/checkpoints/{run_id}"), checkpoints
    # node 0's first rank failed attempt 0 after its mark: attempt 2 finds it
    assert ("2", "0", "0", "True") in {(a, n, local, resumed) for a, n, _, local, resumed in found}, result.stdout
    for attempt in (1, 2):
        assert (f"run {run_id} failed with exit code 3: restarting it, attempt {attempt} of at most 3 restarts "
                f"(MLENV_RESTART_COUNT={attempt})") in result.stderr
    run = project.home / "runs" / run_id
    assert "failing on purpose" in (run / "node-0.log").read_text()
    assert "failing on purpose" in (run / "attempt-1" / "node-1.log").read_text()
    assert "attempt 2 of run" in (run / "attempt-2" / "node-1.log").read_text()
    logs = project.ok("logs", timeout=60).stdout  # every attempt, each under its header, oldest first
    assert attempts(logs) == seen, logs
    for node in (0, 1):
        headers = [logs.index(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run {run_id}, node {node} ====")
                   for k in range(3)]
        assert headers == sorted(headers) and headers[2] < logs.index(f"attempt 2 of run {run_id} on node {node}")
    status = json.loads(project.ok("status", "--json").stdout)["latest_run"]
    assert (status["id"], status["state"], status["attempt"]) == (run_id, "succeeded", 2), status
    assert "succeeded, attempt 2 (restarted 2x" in project.ok("status").stdout


def test_a_detached_run_is_restarted_by_the_nodes(project: LocalProject) -> None:
    started = project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "2", "flaky.py", "--until",
                         "1", timeout=120)
    assert "not restarted" not in started.stderr, started.stderr
    run_id = json.loads(project.ok("status", "--json").stdout)["runs"][-1]["id"]

    def latest() -> dict[str, object]:
        return json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}

    deadline = time.monotonic() + 240
    while (run := latest()).get("state") != "succeeded" or run.get("attempt") != 1:
        assert time.monotonic() < deadline, run
        assert run.get("state") != "failed" or run.get("attempt") == 0, run
        time.sleep(1)
    assert run["id"] == run_id and sorted(rank["rank"] for rank in run["ranks"]) == [0, 1, 2, 3], run  # type: ignore
    logs = project.ok("logs", timeout=60).stdout
    seen = attempts(logs)  # the failed attempt's stop may end a rank before it said who it is
    assert {(attempt, run) for attempt, run, _ in seen} == {(0, run_id), (1, run_id)}, logs
    assert sorted(rank for attempt, _, rank in seen if attempt == 1) == [0, 1, 2, 3], logs
    assert ("mlenv: attempt 0 failed with exit code 3: restarting the run, attempt 1 of at most 2 restarts "
            "(MLENV_RESTART_COUNT=1)") in logs, logs
    assert "failing on purpose" in logs
    stopped = project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "2", "flaky.py", "--until",
                         "0", "--sleep", timeout=120)  # a stop by the user is never restarted
    assert stopped.returncode == 0
    project.ok("stop", timeout=120)
    run = latest()
    assert (run["state"], run["attempt"]) == ("stopped", 0), run
    assert "restarting the run" not in project.ok("logs", timeout=60).stdout


def test_restarts_end_with_the_last_attempts_exit_code(project: LocalProject) -> None:
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text() + "launch:\n  max_restarts: 1\n")  # the file's default
    result = project.mlenv("launch", "--launcher", "torchrun", "flaky.py", "--until", "9", timeout=240)
    assert result.returncode == 3, result.stdout + result.stderr
    assert sorted({attempt for attempt, _, _ in attempts(result.stdout)}) == [0, 1]
    assert result.stderr.count("restarting it") == 1
    never = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "0", "flaky.py", "--until", "9",
                          timeout=240)
    assert never.returncode == 3 and "restarting it" not in never.stderr


def test_a_node_failing_first_twice_is_excluded_and_without_a_spare_the_run_stops(project: LocalProject) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "3", "flaky.py", "--until", "9",
                           "--bad-node", "1", timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert sorted({attempt for attempt, _, _ in attempts(result.stdout)}) == [0, 1], result.stdout[-3000:]
    host = f"{project.app}-1"
    assert (f"excluding {host} (node-1) from the next attempts: it failed first in 2 attempts of the run (this run "
            "only" in result.stderr)
    assert launch_said(result.stderr)[-1] == (
        f"error: {host} must be left out of the run (mlenv nodes says why), and {project.name} has no spare node to "
        "take their place: stopping. mlenv nodes --forget-excluded lets the run use them again")
    # without a node-fault sign, the node is left out of that run only: later runs use it
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    again = project.ok("launch", "--launcher", "torchrun", "flaky.py", "--until", "0", timeout=240)
    assert {node for _, _, node in attempts_by_node(again.stdout)} == {0, 1}, again.stdout


# No torch: global rank 0 opens a file that is not there (a user's bug), in every attempt; "fixed" runs.
BUG_JOB = """\
import os, sys
if sys.argv[1:] != ["fixed"] and os.environ["RANK"] == "0":
    open("no-such-data.bin")
print(f"attempt {os.environ['MLENV_RESTART_COUNT']} of run {os.environ['MLENV_RUN_ID']} on node "
      f"{os.environ['MLENV_NODE_RANK']} rank {os.environ['RANK']}: ok", flush=True)
"""


def test_a_user_s_bug_stops_the_restarts_and_excludes_nothing(project: LocalProject) -> None:
    """The same error of the same rank in two attempts is the script's, not a node's: no third attempt, no node
    left out (torchrun's rendezvous may put rank 0 on either node), and the fixed script runs on both nodes."""
    project.ok("sync", "--source", str(project.source({"bug.py": BUG_JOB})))
    result = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "3", "bug.py", timeout=240)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the same error in attempts 1 and 2: not restarting" in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("restarting it, attempt") == 1 and "excluding" not in result.stderr
    run = latest(project)
    assert (run["attempt"], run["first_failure"]["rank"]) == (1, 0), run
    assert "FileNotFoundError" in run["first_failure"]["log_tail"][-1]
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    fixed = project.ok("launch", "--launcher", "torchrun", "bug.py", "fixed", timeout=240)
    assert {node for _, _, node in attempts_by_node(fixed.stdout)} == {0, 1}, fixed.stdout


def test_a_detached_user_s_bug_stops_the_restarts_on_every_node(project: LocalProject) -> None:
    project.ok("sync", "--source", str(project.source({"bug.py": BUG_JOB})))
    project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "3", "bug.py", timeout=120)
    wait_for(project, "failed", 1)
    deadline = time.monotonic() + 120
    while (logs := project.ok("logs", timeout=60).stdout).count("the same error in attempts 1 and 2: not "
                                                                  "restarting") < 2:  # every node, once it ended
        assert time.monotonic() < deadline, logs
        time.sleep(0.5)
    assert "restarting the run, attempt 2" not in logs, logs
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []


def test_bad_restart_counts_are_bad_input(tmp_path: Path) -> None:
    project = make_project(tmp_path, "lrst2", "10.77.69.0/24", "processes")
    refused = project.mlenv("launch", "-c", project.name, "--max-restarts", "-1", "x.py")
    assert refused.returncode == 2 and "--max-restarts" in refused.stderr and "-1" in refused.stderr
    through_make = make("launch-dry-run", f"CLUSTER={project.name}", "MAX_RESTARTS=-1", home=project.home)
    assert through_make.returncode == 2 and "--max-restarts" in through_make.stderr
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text() + "launch:\n  max_restarts: 1000\n")
    invalid = project.mlenv("validate", project.name)
    assert invalid.returncode == 2 and invalid.stderr.count("\n") == 1, invalid.stderr
    assert "launch.max_restarts" in invalid.stderr


def latest(project: LocalProject) -> dict[str, Any]:
    return json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}


def wait_for(project: LocalProject, state: str, attempt: int, seconds: float = 300) -> dict[str, Any]:
    """The latest run once it is in ``state`` at ``attempt`` (no earlier attempt may end otherwise than failed)."""
    deadline = time.monotonic() + seconds
    while (run := latest(project)).get("state") != state or run.get("attempt") != attempt:
        assert time.monotonic() < deadline, run
        assert run.get("state") not in ("succeeded", "stopped") or run.get("attempt", 0) >= attempt, run
        time.sleep(1)
    return run


RESTARTED = ["--max-restarts", "2", "--expect-transport", "rdma", "--hang-timeout", "5", "--on-hang", "stop",
             "plan.py", "contradict,hang,ok"]


def test_a_transport_contradiction_and_a_hang_stopped_are_restarted_attached(project: LocalProject) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", *RESTARTED, str(project.home / "marks"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "NCCL uses SOCKETS but --expect-transport is rdma" in result.stderr + result.stdout
    assert "failed with exit code 1: restarting it, attempt 1 of at most 2 restarts" in result.stderr
    assert "failed with exit code 124: restarting it, attempt 2 of at most 2 restarts" in result.stderr
    assert "excluding" not in result.stderr  # no node failed: the job was stopped
    assert (run := latest(project))["state"] == "succeeded" and run["attempt"] == 2, run


def test_a_transport_contradiction_and_a_hang_stopped_are_restarted_detached(project: LocalProject) -> None:
    project.ok("launch", "--launcher", "torchrun", "--detach", *RESTARTED, str(project.home / "marks"), timeout=120)
    run = wait_for(project, "succeeded", 2)
    assert sorted(rank["rank"] for rank in run["ranks"]) == [0, 1, 2, 3], run
    logs = project.ok("logs", timeout=60).stdout
    assert "mlenv: attempt 0 failed with exit code 1: restarting the run, attempt 1 of at most 2" in logs, logs
    assert "mlenv: attempt 1 failed with exit code 124: restarting the run, attempt 2 of at most 2" in logs, logs


def test_a_stop_by_the_user_is_never_restarted_attached(project: LocalProject) -> None:
    attached = subprocess.Popen([str(MLENV), "launch", "--launcher", "torchrun", "--max-restarts", "2", "plan.py",
                                 "sleep", "-"], cwd=ROOT, env={**os.environ, "MLENV_HOME": str(project.home)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(latest(project).get("ranks") or []) < 4:
            assert time.monotonic() < deadline and attached.poll() is None
            time.sleep(1)
        project.ok("stop", timeout=120)
        out, err = attached.communicate(timeout=120)
    finally:
        attached.kill()
    assert attached.returncode == 143, out[-2000:] + err[-2000:]
    assert "restarting it" not in err
    assert (latest(project)["state"], latest(project)["attempt"]) == ("stopped", 0)


def test_a_detached_node_that_succeeded_before_another_failed_takes_part_in_the_next_attempt(
        project: LocalProject) -> None:
    # attempt 0: node 0's ranks exit 0, then node 1 fails; attempt 1: node 1's exit 0, then node 0 fails; attempt 2:
    # both succeed (without the succeeded node, the next attempt would wait for it forever)
    project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "2", "plan.py",
               "late-fail-1,late-fail-0,ok", str(project.home / "marks"), timeout=120)
    run = wait_for(project, "succeeded", 2, seconds=360)
    assert sorted((rank["rank"], rank["state"]) for rank in run["ranks"]) == [(r, "succeeded") for r in range(4)]
    logs = project.ok("logs", timeout=60).stdout
    failed = re.findall(r"\[node-(\d) r\d\] failing after the other node's ranks succeeded", logs)
    assert sorted(failed) == ["0", "1"], logs  # node 1 in attempt 0, node 0 in attempt 1
    for attempt in (1, 2):
        assert logs.count(f"restarting the run, attempt {attempt} of at most 2") == 2, logs  # on both nodes
    assert {node for attempt, _, node in attempts_by_node(logs) if attempt == 2} == {0, 1}


def test_a_detached_run_is_not_restarted_after_its_node_failed_first_twice(project: LocalProject) -> None:
    """The nodes' supervisors judge as mlenv does attached, from the first failures they recorded, and stop alike:
    node 1 failed first in attempts 0 and 1, so no node starts attempt 2 (a detached run moves to no spare)."""
    project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "3", "flaky.py", "--until", "9",
               "--bad-node", "1", timeout=120)
    wait_for(project, "failed", 1)
    said = ("mlenv: node-1 must be left out of the run (it failed first in 2 attempts of the run): not restarting it "
            "(the nodes of a detached run restart it where it ran; ssh.spares, or a launch attached, leave the node "
            "out)")
    deadline = time.monotonic() + 120
    while (logs := project.ok("logs", timeout=60).stdout).count(said) < 2:  # every node, once it has ended
        assert time.monotonic() < deadline, logs
        time.sleep(0.5)
    assert {attempt for attempt, _, _ in attempts(logs)} == {0, 1}, logs
    assert "restarting the run, attempt 2" not in logs, logs
    run = latest(project)
    assert (run["state"], run["attempt"], run["first_failure"]["node"]) == ("failed", 1, 1), run


def attempts_by_node(output: str) -> set[tuple[int, str, int]]:
    """(attempt, run id, node) of every rank's first line."""
    return {(int(m[1]), m[2], int(m[3])) for m in re.finditer(r"attempt (\d) of run (\S+) on node (\d) rank", output)}


def test_an_nccl_network_error_excludes_the_node_at_once(project: LocalProject) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "3", "plan.py", "netfail-1", "-",
                           timeout=240)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    host = f"{project.app}-1"
    assert f"excluding {host} (node-1) from the next attempts: NCCL network error: {NET_ERROR}" in result.stderr
    assert sorted({attempt for attempt, _, _ in attempts(result.stdout)}) == [0]  # not after two failures
    assert f"{host} must be left out of the run" in launch_said(result.stderr)[-1]
    failure = latest(project)["first_failure"]
    assert (failure["node"], failure["node_fault"]) == (1, {"sign": "nccl-net", "evidence": NET_ERROR})
    listed = json.loads(project.ok("nodes", "--json").stdout)["excluded"]
    assert [(e["node"], e["host"], e["reason"]) for e in listed] == [(1, host, f"NCCL network error: {NET_ERROR}")]


def test_a_node_whose_supervisor_is_lost_is_excluded_at_once(project: LocalProject) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "3", "plan.py", "lose-1", "-",
                           timeout=240)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    host = f"{project.app}-1"
    assert re.search(rf"excluding {host} \(node-1\) from the next attempts: unreachable: the node's supervisor "
                     r"\(pid \d+\) is gone without an exit status", result.stderr), result.stderr[-3000:]
    # no attempt after the first (the ranks may not have printed their line before the node was lost)
    assert {attempt for attempt, _, _ in attempts(result.stdout)} <= {0}
    run = latest(project)
    assert (run["attempt"], run["node_faults"]["1"]["sign"]) == (0, "unreachable"), run


def test_a_detached_user_stop_reaching_one_node_stops_every_node_and_is_never_restarted(project: LocalProject) -> None:
    # the user's SIGTERM reaches node 0's supervisor only (as an admin's kill would); node 1's rank 0 then fails of
    # its peers' death: it is still the user's stop, on every node, and no node starts another attempt
    project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "2", "plan.py", "stop-race",
               str(project.home / "marks"), timeout=120)
    deadline = time.monotonic() + 120
    while [rank["state"] for rank in latest(project).get("ranks") or []] != ["running"] * 4:
        assert time.monotonic() < deadline, latest(project)
        time.sleep(1)
    (record,) = project.pod_dir(0).glob("workspace/.mlenv/runs/*/attempt-0/node0/record.json")
    os.kill(json.loads(record.read_text())["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 120
    report = json.loads(project.ok("status", "--json").stdout)
    while not all("(" in node for node in report["run_states"].values()):  # until both nodes have ended
        assert time.monotonic() < deadline, report
        time.sleep(1)
        report = json.loads(project.ok("status", "--json").stdout)
    run = report["latest_run"]
    assert (run["state"], run["attempt"], report["run_states"]) == ("stopped", 0, {"0": "stopped (143)",
                                                                                   "1": "stopped (143)"}), report
    assert "restarting the run" not in project.ok("logs", timeout=60).stdout
