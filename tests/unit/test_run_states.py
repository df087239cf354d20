"""One run state from the node to the terminal (issue 40): every path that turns how a node's share ended into a state
(the runtime's records as the fan-out backends read them: local, ssh, Kubernetes, Run:ai; Slurm's node records, its
attempt's end from the restart policy and ``reconcile``; ``latest_run``'s node and run states) gives the same state
for the same end, the one of ``states.exit_state``; and the words that show a decision decide nothing."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from mlenv import state
from mlenv.backends.slurm import followed
from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.noderecords import node_job as slurm_node_job
from mlenv.backends.slurm.runstate import reconcile
from mlenv.core.capabilities import Handle, LaunchOutcome
from mlenv.core.runrecords import latest_run, node_state
from mlenv.ops.launch import attempt_facts
from mlenv.runtime.records import restartpolicy
from mlenv.runtime.records.restartpolicy import History, for_script, judge
from mlenv.runtime.records.runlayout import FirstFailure, NodeDir, write_json
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import RunState, exit_state, run_state
from mlenv.runtime.supervise.jobs import node_job
from mlenv.runtime.supervise.launcher import RUNTIME_PARENT, Job, run_job

NO_PID = (1 << 22) + 1  # above the kernel's largest pid_max: never a process
EXITS = (0, 1, 7, 124, 129, 130, 137, 143)
SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGSEGV)
SUCCEEDED, FAILED, STOPPED = RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED
CODE_ONLY = {0: SUCCEEDED, 1: FAILED, 7: FAILED, 124: FAILED, 129: STOPPED, 130: STOPPED, 137: FAILED, 139: FAILED,
             143: STOPPED}
"""An end known by its exit code alone (128+N: signal N): a stop's signal (SIGHUP, SIGINT, SIGTERM) is a stop, as
docs/runs.md says of the user's stops; SIGKILL is no stop of mlenv's (it writes its own record when it escalates)."""


def write_share(node: NodeDir, code: int, state: dict[str, Any]) -> dict[str, str]:
    """A node's share as a supervisor leaves it: record.json (of a process long gone), state.json and its exit
    file; the same files as the text Slurm's reader gets from the shared run directory."""
    node.path.mkdir(parents=True, exist_ok=True)
    record = {"run_id": node.run_dir.name, "node_rank": node.node, "host": "h0", "pid": NO_PID, "start_ticks": 0,
              "started_at": "2030-01-01T00:00:00.000+00:00", "argv": ["train.py"], "attempt": node.attempt}
    write_json(node.record, record)
    write_json(node.state, state)
    node.exit.write_text(f"{code}\n")
    return {name: (node.path / name).read_text() for name in ("exit", "state.json", "record.json")}


def every_reading(node: NodeDir, files: dict[str, str], code: int) -> dict[str, RunState | None]:
    """The state each path reads of the run whose one node's share is in ``node`` (``files``: its text)."""
    share = node_job(node)
    assert share is not None
    fanout = latest_run(node.run_dir.name, {0: share.to_dict()})  # the runtime's jobs --json, as FanoutJobs reads
    slurm_share = slurm_node_job(files, node.attempt, live=False)
    assert slurm_share is not None
    slurm = latest_run(node.run_dir.name, {0: slurm_share})
    ended = for_script(node.run_dir, node.attempt, code, ["h0"], None).ended.value
    fanout_node, slurm_node = node_state(share.to_dict()), node_state(slurm_share)
    return {"runtime jobs": share.state, "fan-out node": fanout_node.state if fanout_node else None,
            "fan-out run": fanout.state, "slurm node": slurm_node.state if slurm_node else None,
            "slurm run": slurm.state, "policy's attempt end": RunState.parse(ended),
            "slurm reconcile": reconcile(slurm.state, None, ended=ended),
            "run_state": run_state([share.state]), "exit_state": exit_state(code)}


@pytest.mark.parametrize("code", [*EXITS, *(128 + signum for signum in SIGNALS if 128 + signum not in EXITS)])
def test_an_end_known_by_its_code_alone_reads_the_same_everywhere(tmp_path: Path, code: int) -> None:
    """A supervisor killed before it recorded its share's end (state.json still says running)."""
    node = NodeDir(tmp_path / "run", 0, 0)
    readings = every_reading(node, write_share(node, code, {"state": "running"}), code)
    assert readings == dict.fromkeys(readings, CODE_ONLY[code])


LAUNCHER = """import os, signal, subprocess, sys, time
how, number = sys.argv[1], int(sys.argv[2])
if how == "exit":
    sys.exit(number)
if how == "rank":  # one rank, through the runtime's rank wrapper, whose script exits with the number
    script = ["-c", f"raise SystemExit({number})"]
    sys.exit(subprocess.call([sys.executable, "-m", "mlenv.runtime.rank", *script],
                             env={**os.environ, "RANK": "0", "LOCAL_RANK": "0"}))
if how == "stop":  # a stop's signal to the node's supervisor, as mlenv stop, Ctrl-C or scancel send it
    os.kill(os.getppid(), number)
    time.sleep(30)
os.kill(os.getpid(), number)  # killed by something that is no stop
"""


def supervised(run_dir: Path, how: str, number: int) -> tuple[NodeDir, dict[str, str], int]:
    """A real supervisor's share of a run whose launcher ends as ``how`` says (``exit`` N; ``rank``: its one rank
    exits N; ``stop``: signal N sent to the supervisor; ``kill``: the launcher killed by signal N), its exit file
    written as the runtime's ``launch`` writes it."""
    node = NodeDir(run_dir, 0, 0)
    job = Job([sys.executable, "-c", LAUNCHER, how, str(number)],
              {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": RUNTIME_PARENT}, {}, {})
    code = run_job(job, node_dir=node)
    state = json.loads(node.state.read_text())
    return node, write_share(node, code, state), code


@pytest.mark.parametrize(("how", "number", "expected"), [
    *(("exit", code, CODE_ONLY[code]) for code in EXITS),  # a launcher ended with a stop's code was stopped
    *(("rank", code, SUCCEEDED if code == 0 else FAILED) for code in EXITS),  # nobody stopped it: its own failure
    *(("stop", signum, STOPPED) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)),
    *(("kill", signum, FAILED) for signum in (signal.SIGKILL, signal.SIGSEGV)),
])
def test_what_a_supervisor_recorded_reads_the_same_everywhere(tmp_path: Path, how: str, number: int,
                                                              expected: RunState) -> None:
    """Every reader takes the supervisor's record, and Slurm's attempt end agrees with it: a stop's signal delivered
    to the supervisor is a stop, a launcher killed otherwise failed, and a rank that ends with a stop's code while
    nothing stops the job failed (the supervisor knows more than the code)."""
    node, files, code = supervised(tmp_path / "run", how, number)
    assert code == (number if how in ("exit", "rank") else 128 + number)
    readings = every_reading(node, files, code)
    readings.pop("exit_state")  # the code alone: below
    assert readings == dict.fromkeys(readings, expected)
    assert exit_state(code) == CODE_ONLY[code]


def test_the_words_of_a_node_left_out_decide_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a left-out node is recorded for later runs is the verdict's typed ``saved``, wherever it is read (the
    attached launch, the nodes' policy, the Slurm script's resubmitted file), whatever its reason says."""
    monkeypatch.setattr(restartpolicy, "run_only", lambda count: f"node 1 misbehaved {count} times")
    first = FirstFailure(2, 1, 3, None, "exited with 3", ["step 3"], host="gpu-b")
    verdict = judge(1, History(("gpu-b",), "other error"), first)
    assert [(out.node, out.reason, out.saved) for out in verdict.left_out] == [(1, "node 1 misbehaved 2 times", False)]
    run = RunRecord.from_dict({"id": "r", "state": "failed", "first_failure": first.to_dict()})
    outcome = LaunchOutcome(3, {0: 3, 1: 3}, {}, 1, hosts={0: "gpu-a", 1: "gpu-b"})
    attached = attempt_facts(outcome, run, 1).judged(History(("gpu-b",), "other error")).left_out
    assert [(out.reason, out.saved) for out in attached] == [("node 1 misbehaved 2 times", False)]
    assert followed._parse("12 n2 1 saved=0 it failed first in 2 attempts of the run") == (
        "12", "n2", 1, False, "it failed first in 2 attempts of the run")
    assert followed._parse("12 n2 1 saved=1 node 1 misbehaved 2 times") == ("12", "n2", 1, True,
                                                                           "node 1 misbehaved 2 times")
    assert followed._parse("12 n2 1 node failure: Slurm took n2 out of the job") == (  # an earlier version's line
        "12", "n2", 1, False, "node failure: Slurm took n2 out of the job")


def test_the_nodes_a_script_inside_an_allocation_left_out_are_recorded_once(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    runs = tmp_path / "runs"
    for run, deployment, lines in (("r1", "hpc", ["n2 1 saved=1 node failure: Slurm took n2 out of the job",
                                                  "n1 0 saved=0 it failed first in 2 attempts of the run"]),
                                   ("r2", "other", ["n5 1 saved=1 node failure: Slurm took n5 out of the job"])):
        (runs / run).mkdir(parents=True)
        (runs / run / "deployment").write_text(f"{deployment}\n")
        (runs / run / "left").write_text("".join(f"{line}\n" for line in lines))
    handle = Handle("slurm", "hpc", 2, "tcp", True, {}, {})
    followed.left_out(Login(None), state.RECORDS, handle, str(runs))
    assert [(e.node, e.host, e.reason) for e in state.RECORDS.excluded_of("hpc")] == [
        (1, "n2", "node failure: Slurm took n2 out of the job")]  # saved=1 only, the deployment's own runs only
    assert not (runs / "r1" / "left").exists() and (runs / "r2" / "left").exists()
    assert (runs / "r1" / "left.read").read_text().count("\n") == 2
    state.forget_excluded("hpc")
    followed.left_out(Login(None), state.RECORDS, handle, str(runs))  # read once: forgotten stays forgotten
    assert state.RECORDS.excluded_of("hpc") == ()
