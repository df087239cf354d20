"""The goodput of a restarted run on a local cluster of 2 nodes x 2 ranks (processes, gloo): a detached run whose
rank 3 fails after a checkpoint in attempt 0 and that succeeds in attempt 1 carries, in ``status --json``'s
``latest_run.goodput``, two attempts and phases that sum to its wall time within 5 %, with work lost since the
checkpoint; attached, the same run ends with its goodput line after the summary and in ``launch --json``. No
change to the training script."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.local_cluster import LocalProject, make_project, require_local

JOB = """\
import os, sys, time
import torch
import torch.distributed as dist

attempt = int(os.environ["MLENV_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
checkpoints = os.environ["MLENV_CHECKPOINT_DIR"]
os.makedirs(checkpoints, exist_ok=True)
grad = torch.ones(4)
for step in range(40):
    time.sleep(0.1)  # the step's compute
    dist.all_reduce(grad)
    if step == 10 and rank == 0:
        with open(os.path.join(checkpoints, "step.pt"), "w") as saved:
            saved.write(str(step))
    if attempt == 0 and step == 25 and rank == 3:
        print("failing on purpose", flush=True)
        sys.exit(3)
dist.destroy_process_group()  # as a script should: gloo's threads may abort an exit without it
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path_factory.mktemp("goodput"), "lgp", "10.77.92.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"steps.py": JOB})))
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


def test_a_restarted_run_s_phases_sum_to_its_wall_time(project: LocalProject) -> None:
    project.ok("launch", "--detach", "--launcher", "torchrun", "--max-restarts", "1", "steps.py", timeout=120)
    deadline = time.monotonic() + 240
    while True:
        run: dict[str, Any] = json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}
        if run.get("state") == "succeeded" and run.get("attempt") == 1:
            break
        assert time.monotonic() < deadline, run
        assert run.get("state") != "failed" or run.get("attempt") == 0, run.get("first_failure")
        time.sleep(1)
    found = run["goodput"]
    assert found is not None and found["attempts"] == 2, run
    phases = found["phases"]
    assert set(phases) == {"queued", "starting", "productive", "lost", "restarting"}, found
    assert abs(sum(phases.values()) - found["wall"]) <= 0.05 * found["wall"], found
    assert all(value >= 0 for value in phases.values()), found
    # attempt 0 failed about 1.5 s after its checkpoint (steps 11-25 of 0.1 s): only that is lost, not all of it
    assert 0 < phases["lost"] < 10 and phases["restarting"] > 0 and phases["starting"] > 0, found
    assert phases["productive"] > 0 and found["productive_share"] == pytest.approx(
        phases["productive"] / found["wall"], abs=0.001), found
    assert "goodput: " in project.ok("status").stdout


def test_an_attached_run_ends_with_its_goodput(project: LocalProject) -> None:
    result = project.ok("launch", "--json", "--launcher", "torchrun", "--max-restarts", "1", "steps.py", timeout=240)
    found = json.loads(result.stdout)["goodput"]
    assert found is not None and found["attempts"] == 2, result.stdout
    assert abs(sum(found["phases"].values()) - found["wall"]) <= 0.05 * found["wall"], found
    line = next(line for line in result.stderr.splitlines() if line.startswith("goodput: "))
    assert result.stderr.rindex("launch finished in") < result.stderr.index(line), result.stderr
    assert f"% productive ({found['phases']['productive']:.1f} s of {found['wall']:.1f} s; " in line, line
