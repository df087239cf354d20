"""Run history on a local cluster (processes): ``launch --json`` gives the run id on stdout and nothing else there;
``logs -f`` of a detached run restarted under --max-restarts shows every attempt and ends with the run's exit;
``mlenv runs`` lists every run with its state, exit code, attempts and duration; ``logs``/``status``/``stacks RUN_ID``
show one run, an unknown id is bad input; a detached run that runs counts in the JOBS column and its summary says
so, a finished one's says how it ended."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.helpers import assert_shaped, documented_shape
from tests.integration.local_cluster import LocalProject, deployed

pytestmark = pytest.mark.torch

# No torch: "fail": node 1's first rank fails (exit 3); "flaky": so in attempt 0 only; "sleep": everyone waits.
JOB = """\
import os, sys, time
attempt, node, local = int(os.environ["MLENV_RESTART_COUNT"]), os.environ["MLENV_NODE_RANK"], os.environ["LOCAL_RANK"]
print(f"attempt {attempt} on node {node} rank {os.environ['RANK']}", flush=True)
failing = sys.argv[1] == "fail" or (sys.argv[1] == "flaky" and attempt == 0)
if failing and node == "1" and local == "0":
    print("failing on purpose", flush=True)
    sys.exit(3)
if sys.argv[1] == "sleep":
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (processes) holding job.py."""
    with deployed(tmp_path_factory.mktemp("history"), "hist", "10.77.93.0/24", {"job.py": JOB}) as made:
        yield made


def launched(project: LocalProject, *args: str, code: int = 0) -> dict[str, object]:
    """``launch --json ARGS``: its JSON (all its stdout), as docs/json.md shows it."""
    result = project.mlenv("launch", "--json", "--launcher", "torchrun", *args, timeout=240)
    assert result.returncode == code, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert_shaped(report, documented_shape("launch"))
    return dict(report)


def test_launch_json_and_logs_follow_every_attempt_of_a_restarted_detached_run(project: LocalProject) -> None:
    report = launched(project, "--detach", "--max-restarts", "1", "job.py", "flaky")
    assert (report["cluster"], report["detached"], report["exit_code"], report["ok"]) == (project.name, True, None,
                                                                                         True), report
    run_id = report["run_id"]
    followed = project.mlenv("logs", "-f", timeout=240)
    assert followed.returncode == 0, followed.stdout + followed.stderr  # the run's exit, not attempt 0's (3)
    seen = set(re.findall(r"attempt (\d) on node (\d) rank \d", followed.stdout))
    assert {("1", "0"), ("1", "1")} <= seen and "failing on purpose" in followed.stdout, followed.stdout
    for node in (0, 1):
        header = f"mlenv: ==== attempt 1 (MLENV_RESTART_COUNT=1) of run {run_id}, node {node} ===="
        assert header in followed.stdout, followed.stdout
    status = project.ok("status", str(run_id)).stdout
    assert f"{run_id} (job.py" in status and "succeeded, attempt 1 (restarted 1x" in status, status
    assert "exit code 0" in status and "mlenv stop stops it" not in status and "running on" not in status, status


def test_runs_lists_every_run_and_one_run_is_shown_by_its_id(project: LocalProject) -> None:
    succeeded = launched(project, "job.py", "ok")
    failed = launched(project, "job.py", "fail", code=3)
    assert (succeeded["exit_code"], failed["exit_code"]) == (0, 3), (succeeded, failed)
    assert failed["first_failure"] is not None and failed["first_failure"]["node"] == 1, failed  # type: ignore[index]
    listed = project.ok("runs", "--json")
    runs = json.loads(listed.stdout)
    assert_shaped(runs, documented_shape("runs"))
    assert [run["id"] for run in runs][:2] == [failed["run_id"], succeeded["run_id"]], runs  # newest first
    assert len(runs) == 3, runs
    found = {run["id"]: (run["state"], run["exit_code"], run["attempts"]) for run in runs}
    assert found[succeeded["run_id"]] == ("succeeded", 0, 1), runs
    assert found[failed["run_id"]] == ("failed", 3, 1), runs
    assert (runs[2]["state"], runs[2]["exit_code"], runs[2]["attempts"]) == ("succeeded", 0, 2), runs
    assert all(isinstance(run["duration"], float) and run["duration"] >= 0 for run in runs), runs
    in_status = json.loads(project.ok("status", "--json").stdout)["runs"]  # the same facts, oldest first
    assert [(run["id"], run["state"], run["exit_code"], run["attempts"], run["duration"]) for run in in_status] == \
        [(run["id"], run["state"], run["exit_code"], run["attempts"], run["duration"]) for run in reversed(runs)]
    table = project.ok("runs").stdout
    assert "FAILURE" in table and "exited with 3: failing on purpose" in table, table
    shown = project.ok("logs", str(succeeded["run_id"]), timeout=60).stdout  # an older run's output, not the newest's
    assert "attempt 0 on node 1" in shown and "failing on purpose" not in shown, shown
    lines = [json.loads(line) for line in project.ok("logs", "--json", str(failed["run_id"])).stdout.splitlines()]
    for line in lines:
        assert_shaped(line, documented_shape("logs-line"))
    assert any(found["node"] == 1 and isinstance(found["rank"], int) and found["line"] == "failing on purpose"
               for found in lines), lines
    over = project.mlenv("stacks", str(failed["run_id"]))
    assert over.returncode == 2 and f"run {failed['run_id']} is over (failed" in over.stderr, over.stderr
    assert f"mlenv logs {failed['run_id']}" in over.stderr, over.stderr
    for command in ("logs", "status", "stacks"):
        unknown = project.mlenv(command, "20990101-000000-nope")
        assert unknown.returncode == 2, (command, unknown.stderr)
        assert "no run '20990101-000000-nope' of hist: mlenv runs lists its runs" in unknown.stderr, unknown.stderr


def test_a_detached_run_that_runs_counts_as_a_job_and_its_summary_says_so(project: LocalProject) -> None:
    launched(project, "--detach", "job.py", "sleep")
    try:
        report = json.loads(project.ok("status", "--json").stdout)
        assert [pod["extra"]["jobs"] for pod in report["pods"]] == [1, 1], report["pods"]
        assert "running on 2/2 nodes" in project.ok("status").stdout
    finally:
        project.ok("stop", timeout=120)
    stopped = project.ok("status").stdout
    assert "stopped, exit code 143 (node-0 stopped (143), node-1 stopped (143))" in stopped, stopped
    assert [pod["extra"]["jobs"] for pod in project.status()] == [0, 0]
