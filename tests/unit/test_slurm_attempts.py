"""One attempt counter per run on Slurm: the runtime that runs a Slurm run's attempts (runtime/supervise/slurmsteps.py,
which the script execs with the attempt mlenv asked for) starts with that one, or one more than the newest the run's
directory records (a requeue, its own restart, a job submitted to go on without a node) when that is higher, so that
no attempt's directory is ever used twice."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.core.capabilities import LaunchSpec
from mlenv.core.clusters import load_plan
from mlenv.runtime.supervise.slurmsteps import ATTEMPT_FILE, first_attempt

ROOT = Path(__file__).resolve().parents[2]


def asked_for(script: str) -> int:
    """The attempt the script's ``slurm-attempts`` line hands the runtime."""
    line = next(line for line in script.splitlines() if " slurm-attempts " in line)
    words = shlex.split(line.rstrip("\\"))
    return int(words[words.index("--attempt") + 1])


@pytest.mark.parametrize(("asked", "recorded", "expected"), [
    (0, None, 0),  # a new run
    (1, 0, 1),  # mlenv's restart after attempt 0
    (1, 1, 2),  # mlenv's restart after a requeue that ran attempt 1 itself
    (0, 3, 4),  # the job requeued (or resubmitted) after attempt 3
])
def test_an_attempt_s_number_is_never_used_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: int,
                                                 recorded: int | None, expected: int) -> None:
    (tmp_path / "clusters").mkdir()
    shutil.copy(ROOT / "clusters" / "slurm-gloo.yaml", tmp_path / "clusters")
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    backend = SlurmBackend(state.RECORDS)
    handle = backend.prepare(load_plan("slurm-gloo")).handle
    spec = LaunchSpec("torchrun", "train.py", (), run_id="RUN", attempt=asked)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if recorded is not None:
        (run_dir / ATTEMPT_FILE).write_text(f"{recorded}\n")
    assert first_attempt(run_dir, asked_for(backend.prepare_launch(handle, spec).text)) == expected
