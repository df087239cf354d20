"""One launch of a deployment at a time, atomically, on a local cluster (processes), through the real `mlenv`
command: launches at once start one run and refuse the others (exit 2, their error as JSON under --json); an
attached launch holds its run live from its record on, whatever its nodes say; a launch waits while another starts
its run, saying so (interrupted there, it says so in JSON too); a run id taken in the same second gets the next
free suffix, which the readers of run ids take."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from tests.helpers import MLENV, ROOT, assert_shaped, documented_shape, lock_held, said_until
from tests.integration.local_cluster import LocalProject, deployed

# No torch: "sleep" waits (until stopped), "ok" says so and ends.
JOB = """\
import os, sys, time
print(f"{sys.argv[1]} on node {os.environ['MLENV_NODE_RANK']}", flush=True)
if sys.argv[1] == "sleep":
    time.sleep(600)
"""
LAUNCH = ("launch", "--launcher", "torchrun")
TIMEOUT = 240


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (processes) holding job.py."""
    with deployed(tmp_path_factory.mktemp("onelaunch"), "once", "10.77.94.0/24", {"job.py": JOB}) as made:
        yield made


def started(project: LocalProject, *args: str) -> subprocess.Popen[str]:
    """The real `mlenv ARGS` started against ``project``, its stdout and stderr piped."""
    return subprocess.Popen([str(MLENV), *args], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MLENV_HOME": str(project.home)})


def ended(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """``process``'s exit code, stdout and stderr, once it ended."""
    out, err = process.communicate(timeout=TIMEOUT)
    return process.returncode, out, err


def run_ids(project: LocalProject) -> list[str]:
    """The deployment's runs, newest first, as `mlenv runs --json` lists them."""
    return [str(run["id"]) for run in json.loads(project.ok("runs", "--json").stdout)]


def refused(project: LocalProject, live: str, where: str, code: int, out: str, err: str) -> None:
    """A launch refused beside run ``live`` (live ``where``, a pattern): exit 2, one line saying so on stderr (no
    traceback), the same as docs/json.md's error on stdout."""
    said = (rf"run {live} of {project.name} is still running \(({where})\), and a second run would share its "
            rf"ports: wait for it to end, or stop it first \(mlenv stop -c {project.name}\)")
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(f"error: {said}", errors[0]) and "Traceback" not in err, err
    report = json.loads(out)
    assert_shaped(report, documented_shape("error"))
    assert report["ok"] is False and len(report["errors"]) == 1, report
    assert re.fullmatch(said, report["errors"][0]["message"]), report


def test_three_launches_at_once_start_one_run_and_refuse_two(project: LocalProject) -> None:
    before, made = run_ids(project), set((project.home / "runs").glob("*"))
    launches = [started(project, *LAUNCH, "--detach", "--json", "job.py", "sleep") for _ in range(3)]
    try:
        results = [ended(launch) for launch in launches]
        ran = [json.loads(out) for code, out, _ in results if code == 0]
        assert len(ran) == 1 and ran[0]["ok"] is True and ran[0]["detached"] is True, results
        live = ran[0]["run_id"]
        for code, out, err in (result for result in results if result[0] != 0):
            refused(project, live, "node 0|node 1|node 0, 1|its mlenv launch goes on", code, out, err)
        assert run_ids(project) == [live, *before]
        assert set((project.home / "runs").glob("*")) - made == {project.home / "runs" / live}  # none for the others
    finally:
        project.ok("stop", timeout=120)


def test_an_attached_launch_holds_its_run_live_while_it_goes_on(project: LocalProject) -> None:
    before = run_ids(project)
    first = started(project, *LAUNCH, "--json", "job.py", "sleep")
    try:
        deadline = time.monotonic() + 60
        while (listed := run_ids(project)) == before:  # recorded: from here on it is live, whatever its nodes say
            assert first.poll() is None, ended(first)
            assert time.monotonic() < deadline, "the attached launch never recorded its run"
        live = listed[0]
        os.kill(first.pid, signal.SIGSTOP)  # a launch slow to tell its nodes, or between two attempts
        project.ok("stop", timeout=120)  # its nodes (any it started) record it stopped
        refused(project, live, "its mlenv launch goes on",
                *ended(started(project, *LAUNCH, "--json", "job.py", "ok")))
        assert run_ids(project) == [live, *before]
    finally:
        os.kill(first.pid, signal.SIGCONT)
        project.ok("stop", timeout=120)  # what it started once it went on
    code, out, _ = ended(first)
    assert (code, json.loads(out)["run_id"], json.loads(out)["exit_code"]) == (143, live, 143), out


def launched_where_taken(project: LocalProject, *suffixes: str) -> tuple[int, str, str]:
    """``launch --json job.py ok`` where runs of its second have its id with each of ``suffixes`` (their
    directories there, as they leave them): its exit code, stdout and stderr. The deployment's launch lock is held
    from before it starts until those ids of every second its id may come from are taken."""
    runs = project.home / "runs"
    with lock_held(project.home / ".mlenv" / f"launch-{project.name}.lock"):  # another launch starting its run
        since = int(time.time())
        launch = started(project, *LAUNCH, "--json", "job.py", "ok")
        said = said_until(launch, f"waiting for another mlenv to start its run of {project.name}")  # its id made
        assert launch.poll() is None, "".join(said)
        for second in range(since, int(time.time()) + 1):
            stamp = datetime.fromtimestamp(second, timezone.utc).strftime("%Y%m%d-%H%M%S")
            for suffix in suffixes:
                (runs / f"{stamp}-{project.name}{suffix}").mkdir(parents=True, exist_ok=True)
    return ended(launch)


def test_a_run_id_taken_in_the_same_second_gets_the_next_suffix(project: LocalProject) -> None:
    code, out, err = launched_where_taken(project, "", "-2")
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    runs = project.home / "runs"
    assert re.fullmatch(rf"\d{{8}}-\d{{6}}-{project.name}-3", run_id) and (runs / run_id / "node-1.log").is_file(), out
    assert run_ids(project)[0] == run_id  # newest first
    assert "ok on node 1" in project.ok("logs", run_id).stdout
    assert f"{run_id} (job.py" in project.ok("status", run_id).stdout
    before = run_ids(project)
    code, out, err = launched_where_taken(project, "", *(f"-{number}" for number in range(2, 10)))
    taken = (rf"(\d{{8}}-\d{{6}}-{project.name}) and \1-2 to -9 are taken under {re.escape(str(runs))}: "
             "launch again in a second")
    assert code == 1 and re.search(f"^error: {taken}$", err, re.MULTILINE) and "Traceback" not in err, err
    report = json.loads(out)
    assert_shaped(report, documented_shape("error"))
    assert report["ok"] is False and re.fullmatch(taken, report["errors"][0]["message"]), report
    assert run_ids(project) == before


def test_a_launch_interrupted_while_it_waits_says_so_in_json(project: LocalProject) -> None:
    before = run_ids(project)
    with lock_held(project.home / ".mlenv" / f"launch-{project.name}.lock"):
        launch = started(project, *LAUNCH, "--json", "job.py", "ok")
        said = said_until(launch, f"waiting for another mlenv to start its run of {project.name}")
        launch.send_signal(signal.SIGINT)
        code, out, err = ended(launch)
    assert code == 130 and "error: interrupted" in err and "Traceback" not in err, "".join(said) + err
    report = json.loads(out)
    assert_shaped(report, documented_shape("error"))
    assert (report["ok"], [error["message"] for error in report["errors"]]) == (False, ["interrupted"]), report
    assert run_ids(project) == before
