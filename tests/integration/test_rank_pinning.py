"""A node keeps its global ranks across the attempts of a run, on a local cluster (processes) whose nodes each keep
their checkpoints in their own workspace (per-node storage, as a pod's volumeClaimTemplates volume): after node 1
fails attempt 0, every rank of attempt 1 runs on the same node with the same RANK and GROUP_RANK and resumes from the
checkpoint it wrote itself; with torchrun and with DeepSpeed's launcher."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._prereq import require
from tests.integration.local_cluster import LocalProject, deployed

# No torch import (the launcher still gives each rank its RANK; DeepSpeed's gives no GROUP_RANK). Each rank resumes
# from its own checkpoint file in its node's MLENV_CHECKPOINT_DIR, says who it is and where it resumed from, then
# saves its own next one. In attempt 0 each rank also marks, in the shared directory of its last argument (DeepSpeed
# puts --local_rank=N after the script), that it saved; node 1's first rank fails once all four did.
JOB = """\
import json, os, sys, time
attempt, rank, node = int(os.environ["MLENV_RESTART_COUNT"]), int(os.environ["RANK"]), os.environ["MLENV_NODE_RANK"]
checkpoints = os.environ["MLENV_CHECKPOINT_DIR"]
os.makedirs(checkpoints, exist_ok=True)
mine = os.path.join(checkpoints, f"rank{rank}.json")
saved = json.load(open(mine)) if os.path.exists(mine) else None
resumed = "none" if saved is None else f"{saved['rank']}@{saved['attempt']}"
print(f"attempt {attempt} node {node} group {os.environ.get('GROUP_RANK', node)} rank {rank} resumed {resumed} "
      f"in {checkpoints}", flush=True)
with open(mine, "w") as out:
    json.dump({"rank": rank, "attempt": attempt}, out)
if attempt == 0:
    open(os.path.join(sys.argv[-1], f"saved{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(sys.argv[-1])) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    if node == "1" and os.environ["LOCAL_RANK"] == "0":
        sys.exit(3)
    time.sleep(300)
"""
SAID = re.compile(r"^\[node-(\d) r(\d)\] attempt (\d) node (\d) group (\d) rank (\d) resumed (\S+) in (\S+)$",
                  re.MULTILINE)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (processes) holding job.py."""
    with deployed(tmp_path, "pin", "10.77.95.0/24", {"job.py": JOB}) as made:
        yield made


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_a_restarted_run_keeps_each_node_s_ranks_and_each_rank_resumes_from_its_own_checkpoint(
        project: LocalProject, tmp_path: Path, launcher: str) -> None:
    require(*(["deepspeed"] if launcher == "deepspeed" else []))
    marks = tmp_path / "marks"
    marks.mkdir()
    result = project.mlenv("launch", "--launcher", launcher, "--max-restarts", "1", "job.py", str(marks),
                           timeout=240)
    assert result.returncode == 0 and "restarting it, attempt 1" in result.stderr, result.stdout + result.stderr
    said = {(int(attempt), int(rank)): (int(tag_node), int(tag_rank), int(node), int(group), resumed)
            for tag_node, tag_rank, attempt, node, group, rank, resumed, _ in SAID.findall(result.stdout)}
    assert sorted(said) == [(attempt, rank) for attempt in (0, 1) for rank in range(4)], result.stdout
    for (attempt, rank), (tag_node, tag_rank, node, group, resumed) in said.items():
        assert tag_node == node == group == rank // 2 and tag_rank == rank, (attempt, rank, said)  # node N: 2N, 2N+1
        assert resumed == ("none" if attempt == 0 else f"{rank}@0"), (attempt, rank, said)
    stores = {int(node): Path(path) for _, _, _, node, _, _, _, path in SAID.findall(result.stdout)}
    for node in (0, 1):  # per-node storage: each node holds its own ranks' checkpoints only
        held = sorted(path.name for path in stores[node].iterdir())
        assert held == [f"rank{2 * node}.json", f"rank{2 * node + 1}.json"], stores
