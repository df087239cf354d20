"""The runtime's job supervisor on a local cluster of 2 nodes x 2 ranks under torchrun: the first failing rank is
named and its own exit code is launch's, attached or detached, the job stops on every node (also when an attached
launch is killed outright), torchrun's traceback for the signal that stopped it goes to the logs only (a rank's
traceback is shown); every line of every rank arrives whole and tagged; bad ranks (forks, ignored SIGTERM, closed
stdout, 10 MB lines, binary) lose no other rank's lines."""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers import MLENV
from tests.integration.local_cluster import LocalProject, leftovers, make_project, require_local

RANK_FAILS = """\
import os, sys, time
if os.environ["RANK"] == sys.argv[1]:
    print("about to fail", flush=True)
    time.sleep(2)  # the other ranks are up and waiting
    if sys.argv[2:] == ["raise"]:
        raise RuntimeError("failing on purpose")
    sys.exit(7)
print("waiting", flush=True)
time.sleep(300)
"""

CHATTY = """\
import os
rank = os.environ["RANK"]
for i in range(300):
    print(f"rank {rank} line {i} " + "x" * (i % 97))
"""

BAD_RANKS = """\
import os, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
if rank == 0:  # a 10 MB line, then normal ones; then it fails
    print("y" * (10 << 20))
    for i in range(50):
        print(f"rank 0 line {i}")
    sys.stdout.flush()
    time.sleep(3)
    sys.exit(5)
if rank == 1:  # binary output between normal lines
    for i in range(50):
        sys.stdout.buffer.write(bytes(range(256)).replace(b"\\n", b"").replace(b"\\r", b"") + b"\\n")
        print(f"rank 1 line {i}", flush=True)
    time.sleep(300)
if rank == 2:  # closes its output early, forks a child that outlives nothing
    for i in range(50):
        print(f"rank 2 line {i}", flush=True)
    subprocess.Popen(["sleep", "300"])
    os.close(1)
    os.close(2)
    time.sleep(300)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 3: ignores SIGTERM
for i in range(50):
    print(f"rank 3 line {i}", flush=True)
time.sleep(300)
"""

# A progress bar as tqdm draws it: \r, then the bar's state, no newline until the loop ends; for 20 s, an update
# every half second.
BAR = """\
import os, sys, time
rank = os.environ["RANK"]
for step in range(1, 41):
    sys.stdout.write(f"\\rrank {rank} bar {step}/40")
    sys.stdout.flush()
    time.sleep(0.5)
sys.stdout.write("\\n")
print(f"rank {rank} done", flush=True)
"""

TAGGED = re.compile(r"^\[node-(\d) r(\d)\] (.*)$")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2-node processes cluster (2 ranks each) with the jobs synced; cleaned afterwards."""
    require_local("processes")
    project = make_project(tmp_path_factory.mktemp("sup"), "lsup", "10.77.63.0/24", "processes")
    project.ok("deploy", project.name)
    source = project.source({"fails.py": RANK_FAILS, "chatty.py": CHATTY, "bad.py": BAD_RANKS, "bar.py": BAR})
    project.ok("sync", "--cluster", project.name, "--source", str(source))
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def job_processes(cluster: LocalProject) -> list[str]:
    return [item for item in leftovers(cluster) if item.startswith("process")]


def status(cluster: LocalProject) -> dict[str, object]:
    report: dict[str, object] = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
    return report


def test_attached_launch_exits_with_the_failing_rank_s_code_and_names_it(cluster: LocalProject) -> None:
    rank = secrets.randbelow(4)  # any rank, on either node
    started = time.monotonic()
    result = cluster.mlenv("launch", "--cluster", cluster.name, "--launcher", "torchrun", "fails.py", str(rank),
                           timeout=120)
    assert result.returncode == 7, result.stdout + result.stderr
    assert time.monotonic() - started < 60
    named = re.search(rf"mlenv: rank {rank} \(node-(\d), pid \d+\) exited with 7 first; last lines: about to fail",
                      result.stdout)
    assert named, result.stdout
    assert f"[node-{named.group(1)} r{rank}] about to fail" in result.stdout
    assert job_processes(cluster) == []


def test_a_failed_launch_shows_the_rank_s_traceback_and_not_the_launchers_teardown(cluster: LocalProject) -> None:
    """torchrun's traceback for the SIGTERM its node's supervisor stopped it with goes to the node's log only."""
    rank = secrets.randbelow(4)
    result = cluster.mlenv("launch", "--cluster", cluster.name, "--launcher", "torchrun", "fails.py", str(rank),
                           "raise", timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(rf"^\[node-\d r{rank}\] Traceback \(most recent call last\):$(\n.*)*"
                     rf"^\[node-\d r{rank}\] RuntimeError: failing on purpose$", result.stdout, re.MULTILINE), \
        result.stdout
    assert "SignalException" not in result.stdout and "stopping the launcher" not in result.stdout, result.stdout
    logs = "".join(path.read_text() for path in Path(result.stderr.split("logs in ")[1].split()[0]).glob("*.log"))
    assert "mlenv: stopping the launcher with SIGTERM" in logs and "SignalException: Process" in logs, logs
    assert job_processes(cluster) == []


def test_an_attached_launch_killed_outright_stops_the_run_on_every_node(cluster: LocalProject) -> None:
    """mlenv SIGKILLed stops nothing itself: each node's supervisor gets SIGTERM as mlenv dies (local: its
    parent-death signal; elsewhere: its stdin closes), stops its share and records the run stopped."""
    launch = subprocess.Popen([str(MLENV), "launch", "--cluster", cluster.name, "--launcher", "torchrun", "fails.py",
                               "-1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ, "MLENV_HOME": str(cluster.home)})  # no rank -1: every rank waits
    assert launch.stdout is not None
    seen = b""
    while seen.count(b"] waiting") < 4:
        assert select.select([launch.stdout], [], [], 90)[0] and launch.poll() is None, seen
        seen += os.read(launch.stdout.fileno(), 1 << 16)
    launch.kill()
    launch.wait()
    launch.stdout.close()  # nobody reads the nodes' output any more
    deadline = time.monotonic() + 30
    while left := job_processes(cluster):
        assert time.monotonic() < deadline, left
        time.sleep(0.2)
    run = status(cluster)["latest_run"]
    assert isinstance(run, dict) and run["state"] == "stopped", run
    assert [rank["state"] for rank in run["ranks"]] == ["stopped"] * 4, run


def test_detached_failure_is_the_run_s_state_and_first_failure(cluster: LocalProject) -> None:
    rank = secrets.randbelow(4)  # any rank, on either node
    cluster.ok("launch", "--cluster", cluster.name, "--launcher", "torchrun", "--detach", "fails.py", str(rank))
    deadline = time.monotonic() + 90
    report = status(cluster)
    while "running" in str(report.get("run_states")) and time.monotonic() < deadline:
        time.sleep(1)
        report = status(cluster)
    run = report["latest_run"]
    assert isinstance(run, dict) and run["state"] == "failed", report
    first = run["first_failure"]
    assert (first["rank"], first["exit_code"], first["signal"], first["reason"]) == (rank, 7, None, "exited with 7")
    assert first["log_tail"] == ["about to fail"]
    ranks = run["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["node"] for r in ranks} == {0, 1} and all(r["pid"] > 0 and r["host"] for r in ranks)
    states = {r["rank"]: r["state"] for r in ranks}
    # one first failure; the others were stopped, or (on a loaded machine) failed of their peer's death just before
    # the stop reached them: either way they ended and the run names only the first
    assert states[rank] == "failed" and all(states[r] in ("stopped", "failed") for r in range(4)), states
    ended = [datetime.fromisoformat(r["ended_at"]) for r in ranks]
    assert (max(ended) - min(ended)).total_seconds() < 10  # the job stopped on every node within 10 s
    assert run["attempt"] == 0 and run["id"]
    assert job_processes(cluster) == []


def test_every_line_arrives_whole_and_tagged(cluster: LocalProject) -> None:
    result = cluster.ok("launch", "--cluster", cluster.name, "--launcher", "torchrun", "chatty.py", timeout=120)
    counts: Counter[str] = Counter()
    for line in result.stdout.splitlines():
        tagged = TAGGED.match(line)
        if tagged and "line" in tagged.group(3):
            body = re.fullmatch(r"rank (\d) line (\d+) (x*)", tagged.group(3))
            assert body and body.group(1) == tagged.group(2), line  # whole, and tagged with its own rank
            assert len(body.group(3)) == int(body.group(2)) % 97, line
            counts[tagged.group(2)] += 1
    assert counts == {"0": 300, "1": 300, "2": 300, "3": 300}
    one = cluster.ok("logs", "--cluster", cluster.name, "--rank", "2").stdout.splitlines()
    assert len(one) == 300 and all(re.match(r"\[node-\d r2\] rank 2 line \d+ ", line) for line in one)
    unknown = cluster.mlenv("logs", "--cluster", cluster.name, "--rank", "9")
    assert unknown.returncode == 2 and "rank 9 is not in the latest run" in unknown.stderr, unknown.stderr


def test_a_progress_bar_is_output_tagged_on_the_terminal_and_whole_in_the_log(cluster: LocalProject) -> None:
    """A bar drawn with \\r for 20 s, updated every half second, never looks hung to a 10 s hang watchdog (which would
    stop a silent job 15 s after its last output); every state of it is tagged with its rank where the terminal shows
    it, and a whole line of the log."""
    result = cluster.mlenv("launch", "--cluster", cluster.name, "--launcher", "torchrun", "--hang-timeout", "10",
                           "--on-hang", "stop", "bar.py", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    pieces = [piece for piece in re.split(r"[\r\n]", result.stdout) if " bar " in piece]
    for piece in pieces:
        tagged = TAGGED.match(piece)
        assert tagged and re.fullmatch(rf"rank {tagged.group(2)} bar \d+/40", tagged.group(3)), piece
    assert {piece.split()[3] for piece in pieces if piece.endswith(" bar 40/40")} == {"0", "1", "2", "3"}
    assert "hung" not in result.stdout + result.stderr
    logged = cluster.ok("logs", "--cluster", cluster.name, "--rank", "1").stdout.splitlines()
    assert [re.sub(r"^\[node-\d r1\] ", "", line) for line in logged] == [
        *(f"rank 1 bar {step}/40" for step in range(1, 41)), "rank 1 done"], logged


def test_bad_ranks_lose_no_other_rank_s_lines(cluster: LocalProject) -> None:
    started = time.monotonic()
    result = cluster.mlenv("launch", "--cluster", cluster.name, "--launcher", "torchrun", "bad.py", timeout=180)
    assert result.returncode == 5, result.stderr[-3000:]
    assert time.monotonic() - started < 90
    lines = result.stdout.split("\n")  # not splitlines: binary output holds \x0b, \x1c, ...
    for rank in range(4):
        ours = [line for line in lines if re.fullmatch(rf"\[node-\d r{rank}\] rank {rank} line \d+", line)]
        assert len(ours) == 50, (rank, len(ours))
    assert any(line.endswith("] " + "y" * (10 << 20)) for line in lines)  # the 10 MB line, whole
    assert sum("\ufffd" in line for line in lines if re.match(r"\[node-\d r1\] ", line)) == 50  # binary, replaced
    assert re.search(r"mlenv: rank 0 \(node-\d, pid \d+\) exited with 5 first", result.stdout)
    assert job_processes(cluster) == []  # rank 3, which ignores SIGTERM, was killed after the grace time
