"""One attempt counter per run on Slurm: the script that starts an attempt takes the one mlenv asked for, or one more
than the newest the run's directory records (a requeue, the script's own restart, a job submitted to go on without a
node) when that is higher, so that no attempt's directory is ever used twice. Run by bash, as Slurm would."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.core.capabilities import LaunchSpec
from mlenv.core.clusters import load_plan

ROOT = Path(__file__).resolve().parents[2]


def counter(script: str) -> str:
    """The lines of ``script`` that decide MLENV_RESTART_COUNT."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# the attempt: one counter per run"))
    end = next(i for i, line in enumerate(lines) if line == "export MLENV_RESTART_COUNT")
    return "\n".join(lines[start:end + 1])


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
        (run_dir / "attempt").write_text(f"{recorded}\n")
    lines = counter(backend.prepare_launch(handle, spec).text)
    said = subprocess.run(["bash", "-c", f"{lines}\necho $MLENV_RESTART_COUNT"], capture_output=True, text=True,
                          env={"MLENV_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert said.strip() == str(expected)
