"""Stragglers named from arrival at collectives, on a local cluster of 2 nodes x 2 ranks (gloo): in a job where one
rank, chosen at random, takes 3x as long per step, the straggler watch names that rank in status and in the run's
output within 60 s, and under ``--on-straggler exclude`` its node carries the node-fault sign ``straggler`` (left out
at the next restart); in a job of equal ranks it names none once it has judged. No change to the training
script."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.local_cluster import LocalProject, make_project, require_local

pytestmark = pytest.mark.timing  # judges which rank is slower (tests/tiers.py: TIMING)

JOB = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(4)
for step in range(2000):
    time.sleep({slow} if rank == {straggler} else 0.05)  # the step's compute
    dist.all_reduce(grad)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path_factory.mktemp("stragglers"), "lsg", "10.77.75.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


def judged(project: LocalProject, deadline: float) -> dict[str, Any]:
    """The latest run once the straggler watch has judged it (``stragglers`` a list)."""
    until = time.monotonic() + deadline
    while True:
        run = json.loads(project.ok("status", "--json").stdout).get("latest_run") or {}
        if isinstance(run.get("stragglers"), list) and (run["stragglers"] or run.get("state") == "running"):
            return dict(run)
        assert time.monotonic() < until, f"not judged within {deadline:g} s: {run}"
        time.sleep(1)


def _launch(project: LocalProject, slow: float, straggler: int, *options: str) -> float:
    project.ok("sync", "--source", str(project.source({"steps.py": JOB.format(slow=slow, straggler=straggler)})))
    project.ok("launch", "--detach", "--launcher", "torchrun", *options, "steps.py")
    return time.monotonic()


def test_a_rank_three_times_slower_is_named_within_60_s(project: LocalProject) -> None:
    straggler = random.Random().randrange(4)  # noqa: S311 - a test's choice, not a secret
    started = _launch(project, 0.15, straggler, "--on-straggler", "exclude")
    until = started + 60
    while True:
        run = judged(project, until - time.monotonic())
        if run["stragglers"]:
            break
        time.sleep(1)
    named = run["stragglers"]
    assert [entry.get("rank") for entry in named] == [straggler], named
    assert named[0]["share"] > 0.3 and named[0]["median_margin_s"] > 0.05, named
    text = named[0]["text"]
    assert text.startswith(f"rank {straggler} (node-{named[0]['node']}) (") and "is a straggler" in text
    assert text in project.ok("status").stdout
    assert f"mlenv: {text}" in project.ok("logs").stdout
    project.ok("stop")
    faults = json.loads(project.ok("status", "--json").stdout)["latest_run"]["node_faults"]
    assert faults == {str(named[0]["node"]): {"sign": "straggler", "evidence": text}}, faults


def test_equal_ranks_name_nobody(project: LocalProject) -> None:
    _launch(project, 0.05, -1)
    run = judged(project, 90)
    assert run["stragglers"] == [], run["stragglers"]
    assert "is a straggler" not in project.ok("logs").stdout
    project.ok("stop")
