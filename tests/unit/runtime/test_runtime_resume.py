"""A detached run taken away under its pods resumes (rule 6 of runtime/records/restartpolicy.py): ``resumes`` is the
one decision, asked by the nodes still there (detached.py ``restart``) and by a pod that comes back (the runtime's
``resume``, which its PID 1 runs). Here on real run directories, through the real runtime command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlenv.runtime.records.restartpolicy import resumes
from mlenv.runtime.records.runlayout import NodeDir, resume_file, write_json

ROOT = Path(__file__).resolve().parents[3]
SECRET = "from-the-run-s-secret"  # noqa: S105 - a test's stand-in for the run's Secret


def test_only_a_preemption_resumes_and_only_where_the_pod_stays(tmp_path: Path) -> None:
    mark = tmp_path / "taken-away"
    pod = {"MLENV_PREEMPTED_MARK": str(mark)}
    assert resumes("preempted", 1, None, pod)
    assert not resumes("failed", 1, None, pod) and not resumes("stopped", 1, None, pod)
    assert not resumes("preempted", 1, None, {})  # no pod (local, ssh): nodes are never taken away there
    assert resumes("preempted", 2, 2, pod) and not resumes("preempted", 3, 2, pod)  # --max-preemptions 2
    mark.write_text("now\n")  # this pod is the one taken away: it resumes once it is back, not here
    assert not resumes("preempted", 1, None, pod)


def _resume(tmp_path: Path, run: str, **secret: str) -> subprocess.CompletedProcess[str]:
    """The runtime's ``resume`` as a pod's PID 1 runs it, the run's Secret (``run`` and ``secret``) as files."""
    secrets = tmp_path / "run-secret"
    secrets.mkdir(exist_ok=True)
    for name, value in {"MLENV_RESUME_RUN": run, **secret}.items():
        (secrets / name).write_text(value)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT / "tools"), "MLENV_NODE_RANK": "1",
           "MLENV_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "MLENV_PREEMPTED_MARK": str(tmp_path / "mark"), "MLENV_RUN_SECRETS": str(secrets)}
    return subprocess.run([sys.executable, "-m", "mlenv.runtime", "resume", "--runs-root", str(tmp_path / "runs")],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("state", "said"), [
    ("succeeded", "run r1 is not resumed on node 1: its attempt 0 here is succeeded"),
    ("failed", "run r1 is not resumed on node 1: its attempt 0 here is failed"),
])
def test_a_pod_back_resumes_nothing_but_a_preempted_share(tmp_path: Path, state: str, said: str) -> None:
    run_dir = tmp_path / "runs" / "r1"
    NodeDir(run_dir, 0, 1).path.mkdir(parents=True)
    write_json(NodeDir(run_dir, 0, 1).state, {"state": state})
    resume_file(run_dir, 1).parent.mkdir()
    write_json(resume_file(run_dir, 1), {"argv": ["false"], "cwd": str(tmp_path), "env": {}})
    done = _resume(tmp_path, "r1")
    assert (done.returncode, done.stdout.strip()) == (0, f"mlenv: {said}"), done.stderr


def test_a_pod_back_without_the_run_says_so(tmp_path: Path) -> None:
    assert _resume(tmp_path, "r9").stdout.strip() == "mlenv: nothing to resume on node 1 (run r9 never ran here)"
    assert _resume(tmp_path, "").stdout.strip() == "mlenv: nothing to resume on node 1"


def test_a_pod_back_starts_its_share_as_the_next_attempt(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    for attempt in (0, 1):
        NodeDir(run_dir, attempt, 1).path.mkdir(parents=True)
        write_json(NodeDir(run_dir, attempt, 1).state, {"state": "preempted"})
    started = tmp_path / "started.json"
    argv = [sys.executable, "-c", f"import json, os; open({str(started)!r}, 'w').write(json.dumps(dict(os.environ)))"]
    resume_file(run_dir, 1).parent.mkdir()
    write_json(resume_file(run_dir, 1), {"argv": argv, "cwd": str(tmp_path), "max_preemptions": 2,
                                         "env": {"MLENV_CHECKPOINT_DIR": "/ckpt/r1"}})
    done = _resume(tmp_path, "r1", MLENV_CONTROL_SECRET=SECRET)
    assert done.returncode == 0, done.stderr
    assert "node 1 is back after a preemption: resuming run r1 as attempt 2" in done.stdout
    env = json.loads(started.read_text())
    assert (env["MLENV_RESTART_COUNT"], env["MLENV_CHECKPOINT_DIR"]) == ("2", "/ckpt/r1")
    assert env["MLENV_CONTROL_SECRET"] == SECRET  # from the run's Secret, mounted in the pod
    NodeDir(run_dir, 2, 1).path.mkdir(parents=True)
    write_json(NodeDir(run_dir, 2, 1).state, {"state": "preempted"})  # a third preemption: over --max-preemptions
    assert "(at most 2 preemptions)" in _resume(tmp_path, "r1").stdout
