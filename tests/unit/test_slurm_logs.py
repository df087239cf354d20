"""The Slurm backend's logs script (run by sh on the login host, here on a real directory tree): the newest run's log
of a node; after a restart every attempt's, each under a header naming it, the newest last; --rank filters them."""

from __future__ import annotations

import subprocess
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
