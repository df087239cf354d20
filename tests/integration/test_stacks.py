"""``mlenv stacks`` on a local cluster of 2 nodes x 2 ranks (gloo): one rank, chosen at random, sits in a function
with a random name while the other three wait in all_reduce. py-spy and the faulthandler fallback each take every
rank's stack; the odd rank out is named first."""

from __future__ import annotations

import json
import random
import string
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlenv.runtime.forensics.stacks import find_py_spy

from tests._prereq import require
from tests.helpers import assert_shaped, documented_shape
from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.integration.test_hang import HANG
from tests.integration.test_makefile import ok

WARM_UP = 3
"""All-reduces every rank completes before rank ``stuck`` stops calling collectives."""


def hanging_job(function: str, stuck: int) -> str:
    """test_hang's job with rank ``stuck`` in ``function`` for good (it is never released) after WARM_UP
    all-reduces, the others in the next all_reduce (the same line numbers as test_hang's)."""
    job = HANG.format(function=function, stuck=stuck, release="/nonexistent/never-released")
    return job.replace('print(f"rank {rank} up", flush=True)',
                       f'print(f"rank {{rank}} up", flush=True); [dist.all_reduce(t) for _ in range({WARM_UP})]')


def until_grouped(stacks: Callable[[], subprocess.CompletedProcess[str]], stuck: int, function: str,
                  deadline: float) -> None:
    """Run ``stacks`` (``mlenv stacks --json``) until rank ``stuck`` sits in ``function`` and the other three in
    all_reduce (a rank that is still starting may be sampled in an import); fail with its last answer after
    ``deadline`` seconds."""
    expected = [([stuck], function), ([rank for rank in range(4) if rank != stuck], "all_reduce")]
    until = time.monotonic() + deadline
    while True:
        result = stacks()
        report = json.loads(result.stdout) if result.returncode == 0 else {}
        if [(g["ranks"], g["frames"][-1]["function"] if g["frames"] else None)  # none yet: a rank starting
                for g in report.get("groups", [])] == expected:
            return
        assert time.monotonic() < until, result.stdout + result.stderr
        time.sleep(1)

@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalProject, str, int]]:
    """A deployed 2x2 local cluster running the hanging job detached: (project, function, stuck rank)."""
    require_local("processes")
    if find_py_spy() is None:
        require("py-spy")  # skips, or fails under CI
    draw = random.Random()  # noqa: S311 - a test's choice, not a secret
    function = "stuck_" + "".join(draw.choices(string.ascii_lowercase, k=10))
    stuck = draw.randrange(4)
    project = make_project(tmp_path_factory.mktemp("stacks"), "lst", "10.77.72.0/24", "processes")
    project.ok("deploy", project.name)
    project.ok("sync", "--source", str(project.source({"hang.py": hanging_job(function, stuck)})))
    project.ok("launch", "--detach", "--launcher", "torchrun", "hang.py")
    yield project, function, stuck
    project.mlenv("stop")
    project.mlenv("clean", "--delete-data", "--yes")


def _sampled(project: LocalProject, *args: str, deadline: float = 120) -> dict[str, Any]:
    """``mlenv stacks --json ARGS`` once every rank is in its place (the job is still starting before that)."""
    until = time.monotonic() + deadline
    while True:
        result = project.mlenv("stacks", "--json", *args, timeout=60)
        report = json.loads(result.stdout) if result.returncode == 0 else {}
        frames = [[f["function"] for f in rank["frames"]] for rank in report.get("ranks", [])]
        if len(frames) == 4 and all("all_reduce" in f or any(n.startswith("stuck_") for n in f) for f in frames):
            return report
        assert time.monotonic() < until, result.stdout + result.stderr
        time.sleep(1)


@pytest.mark.parametrize("method", ["py-spy", "faulthandler"])
def test_every_rank_grouped_odd_one_first(hung: tuple[LocalProject, str, int], method: str) -> None:
    project, function, stuck = hung
    _sampled(project, "--method", method)  # every rank in its place
    started = time.monotonic()
    report = json.loads(project.ok("stacks", "--json", "--method", method).stdout)
    assert time.monotonic() - started < 30  # one answer of every node, on a loaded 2-core machine
    assert_shaped(report, documented_shape("stacks"))
    ranks = {rank["rank"]: rank for rank in report["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3] and {r["node"] for r in ranks.values()} == {0, 1}
    assert {r["method"] for r in ranks.values()} == {method}
    odd, rest = report["groups"]
    assert odd["ranks"] == [stuck] and [f["function"] for f in odd["frames"]] == ["<module>", function]
    assert rest["ranks"] == sorted(set(range(4)) - {stuck})
    assert rest["frames"][0]["function"] == "<module>" and rest["frames"][-1]["function"] == "all_reduce"
    assert all(ranks[r]["frames"] == rest["frames"] for r in rest["ranks"])  # frames outermost first
    assert all(isinstance(f["line"], int) and f["file"].endswith(".py") for f in odd["frames"])
    named = report["collectives"]
    assert named["verdict"] == "behind" and named["unknown"] == [], named
    default = named["groups"][0]
    assert default["front"] == WARM_UP + 1 and default["waiting"] == sorted(set(range(4)) - {stuck})
    assert [(b["rank"], b["last_seq"], b["last_done"]) for b in default["behind"]] == [(stuck, WARM_UP, True)]
    text = project.ok("stacks", "--method", method).stdout.splitlines()
    others = {0: "1-3", 1: "0,2-3", 2: "0-1,3", 3: "0-2"}[stuck]
    assert text[1] == f"collectives: ranks {others} wait in all_reduce #{WARM_UP + 1}; rank {stuck} last completed " \
                      f"#{WARM_UP} and is in hang.py:7 {function}"
    assert text[2] == f"rank {stuck} (node-{ranks[stuck]['node']}): hang.py:7 {function}"
    assert f"ranks {others} (node-0, node-1): hang.py:15 <module> → all_reduce" in text


def test_native_frames_have_no_source(hung: tuple[LocalProject, str, int]) -> None:
    project, function, stuck = hung
    report = _sampled(project, "--native", "--method", "py-spy")
    frames = next(r for r in report["ranks"] if r["rank"] == stuck)["frames"]
    native = [f for f in frames if f["file"] is None]
    assert native and all(f["line"] is None for f in native)
    assert [f["function"] for f in frames if f["file"]] == ["<module>", function]


def test_pod_narrows_to_one_node_through_make(hung: tuple[LocalProject, str, int]) -> None:
    project, function, stuck = hung
    _sampled(project)
    one = json.loads(project.ok("stacks", "--json", "--pod", "1").stdout)
    assert sorted(rank["rank"] for rank in one["ranks"]) and {rank["node"] for rank in one["ranks"]} == {1}
    assert len(one["ranks"]) == 2
    made = ok("stacks", "POD=1", home=project.home).stdout
    assert "(node-1)" in made and "node-0" not in made
    assert (function in made) is (stuck in [rank["rank"] for rank in one["ranks"]])


def test_a_run_that_is_over_and_no_run_exit_1(hung: tuple[LocalProject, str, int], tmp_path: Path) -> None:
    project, _, _ = hung
    project.ok("stop")
    over = project.mlenv("stacks")
    assert over.returncode == 1 and "is over (stopped): stacks samples a running job" in over.stderr, over.stderr
    fresh = make_project(tmp_path, "lsn", "10.77.73.0/24", "processes")
    fresh.ok("deploy", fresh.name)
    try:
        none = fresh.mlenv("stacks")
        assert none.returncode == 1 and "no run of mlenv's on the nodes of lsn" in none.stderr, none.stderr
    finally:
        fresh.mlenv("clean", "--delete-data", "--yes")
