"""The Slurm backend's logs script (run by sh on the login host, here on a real directory tree): the newest run's log
of a node; after a restart every attempt's, each under a header naming it, the newest last; --rank filters them;
following goes on into each attempt the run's script says comes, and ends with the run."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

from mlenv.backends.slurm.backend import LOGS


def logs(runs: Path, node: int, rank: str = "", name: str = "", run: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", LOGS, "sh", str(runs), str(node), "", rank, name, run], capture_output=True,
                          text=True, timeout=30)


def write(runs: Path, run: str, attempt: int, node: int, *lines: str) -> None:
    directory = runs / run / f"attempt-{attempt}" / f"node{node}"
    directory.mkdir(parents=True)
    (directory / "output.log").write_text("".join(f"{line}\n" for line in lines))
    (directory / "ranks.json").write_text(f'[{{"rank": {2 * node}, "node": {node}}}]')


def test_one_attempt_is_shown_as_it_is(tmp_path: Path) -> None:
    write(tmp_path, "r1", 0, 0, "[node-0 r0] hello")
    shown = logs(tmp_path, 0)
    assert (shown.returncode, shown.stdout) == (0, "[node-0 r0] hello\n"), shown.stderr


def test_every_attempt_of_a_restarted_run_under_its_header(tmp_path: Path) -> None:
    write(tmp_path, "r1", 0, 1, "[node-1 r2] old run")
    for attempt in range(3):
        write(tmp_path, "r2", attempt, 1, f"[node-1 r2] attempt {attempt}", "mlenv: a note")
    shown = logs(tmp_path, 1)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "".join(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run r2, node 1 ====\n"
                                   f"[node-1 r2] attempt {k}\nmlenv: a note\n" for k in range(3))
    only = logs(tmp_path, 1, "2")
    assert only.stdout == "".join(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run r2, node 1 ====\n"
                                  f"[node-1 r2] attempt {k}\n" for k in range(3))


def test_a_run_named_by_its_id_rather_than_the_newest(tmp_path: Path) -> None:
    write(tmp_path, "r1", 0, 0, "[node-0 r0] older")
    write(tmp_path, "r2", 0, 0, "[node-0 r0] newer")
    assert logs(tmp_path, 0, run="r1").stdout == "[node-0 r0] older\n"
    assert logs(tmp_path, 0).stdout == "[node-0 r0] newer\n"


def test_a_run_of_the_same_second_with_its_suffix_is_the_newer(tmp_path: Path) -> None:
    write(tmp_path, "20261125-200000-a", 0, 0, "[node-0 r0] older")
    write(tmp_path, "20261125-200000-a-2", 0, 0, "[node-0 r0] newer")
    assert logs(tmp_path, 0).stdout == "[node-0 r0] newer\n"


def test_a_rank_through_every_attempt_wherever_it_ran(tmp_path: Path) -> None:
    """Rank 2 ran on node 1, then (after the restart) on node 0; attempts sort by number, 10 after 9."""
    for attempt in range(11):
        node = 1 if attempt == 0 else 0
        directory = tmp_path / "r1" / f"attempt-{attempt}" / f"node{node}"
        directory.mkdir(parents=True)
        (directory / "output.log").write_text(f"[node-{node} r2] attempt {attempt}\n[node-{node} r9] other\n")
        (directory / "ranks.json").write_text(f'[{{"rank": 2, "node": {node}}}]')
    only = logs(tmp_path, 0, "2")
    assert only.returncode == 0, only.stderr
    assert only.stdout == "".join(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run r1, node {int(k == 0)} "
                                  f"====\n[node-{int(k == 0)} r2] attempt {k}\n" for k in range(11))
    assert logs(tmp_path, 0, "5").returncode == 2  # in no attempt


def test_the_deployment_s_own_run_never_another_file_s_sharing_the_workdir(tmp_path: Path) -> None:
    write(tmp_path, "20261125-200000-a", 0, 0, "[node-0 r0] mine")
    write(tmp_path, "20261125-200100-b", 0, 0, "[node-0 r0] theirs")
    (tmp_path / "20261125-200000-a" / "deployment").write_text("a\n")
    (tmp_path / "20261125-200100-b" / "deployment").write_text("b\n")
    assert logs(tmp_path, 0, name="a").stdout == "[node-0 r0] mine\n"
    assert logs(tmp_path, 0, name="b").stdout == "[node-0 r0] theirs\n"


def follow(runs: Path, node: int) -> subprocess.Popen[str]:
    return subprocess.Popen(["sh", "-c", LOGS, "sh", str(runs), str(node), "1", "", "", ""], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def read_until(follower: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """What the follower printed up to the line holding ``text`` (fails at ``timeout``)."""
    assert follower.stdout is not None
    shown, deadline = "", time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:  # the pipe itself: nothing waits in a buffer above it
        selector.register(follower.stdout.fileno(), selectors.EVENT_READ)
        while text not in shown:
            assert selector.select(deadline - time.monotonic()), f"no {text!r} in time: {shown!r}"
            chunk = os.read(follower.stdout.fileno(), 1 << 16).decode()
            assert chunk, f"the follower ended before {text!r}: {shown!r}"
            shown += chunk
    return shown


def test_follow_goes_on_into_the_attempt_the_script_said_comes(tmp_path: Path) -> None:
    """Attempt 0 has ended (its exit file) and the script said where the run goes on (its next file): the follower
    says that it waits, follows attempt 1 once its log appears, and ends with attempt 1's exit code."""
    write(tmp_path, "r1", 0, 0, "[node-0 r0] attempt 0")
    (tmp_path / "r1" / "attempt-0" / "next").write_text("job 5 requeued\n")
    (tmp_path / "r1" / "attempt-0" / "exit").write_text("3\n")
    follower = follow(tmp_path, 0)
    try:
        shown = read_until(follower, "waiting for attempt 1")
        write(tmp_path, "r1", 1, 0, "[node-0 r0] attempt 1")
        (tmp_path / "r1" / "attempt-1" / "exit").write_text("4\n")
        rest, _ = follower.communicate(timeout=30)
    finally:
        follower.kill()
        follower.wait()
    assert follower.returncode == 4, shown + rest
    assert shown + rest == ("[node-0 r0] attempt 0\n"
                            "mlenv: attempt 0 ended (exit 3); waiting for attempt 1 (job 5 requeued)\n"
                            "mlenv: ==== attempt 1 (MLENV_RESTART_COUNT=1) of run r1, node 0 ====\n"
                            "[node-0 r0] attempt 1\n")


def test_follow_ends_when_the_run_ends_before_its_next_attempt(tmp_path: Path) -> None:
    """While the follower waits for attempt 1: a requeue that failed (the next file gone, the exit code rewritten)
    ends it with the run's code, mlenv stop (the run's stop file) with 143."""
    for run, end, code in (("r1", "next", 1), ("r2", "stop", 143)):
        write(tmp_path, run, 0, 0, f"[node-0 r0] {run}")
        (tmp_path / run / "attempt-0" / "next").write_text("job 5 requeued\n")
        (tmp_path / run / "attempt-0" / "exit").write_text("0\n")
        follower = follow(tmp_path, 0)
        try:
            read_until(follower, "waiting for attempt 1")
            if end == "next":
                (tmp_path / run / "attempt-0" / "exit").write_text("1\n")
                (tmp_path / run / "attempt-0" / "next").unlink()
            else:
                (tmp_path / run / "stop").write_text("now\n")
            follower.communicate(timeout=30)
        finally:
            follower.kill()
            follower.wait()
        assert follower.returncode == code, run
