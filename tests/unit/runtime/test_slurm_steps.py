"""The runtime that runs a Slurm run's attempts (runtime/supervise/slurmsteps.py), run as its script execs it, with
Slurm's commands stood in for by small scripts on PATH (srun runs its task here; the others answer as for a healthy
one-job cluster): what each attempt leaves in the run's directory, what it says, a spare taking a left-out node's
place, and a stop, by mlenv stop's file or by a signal, ending the attempt with 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SLURM = {
    # the master's hostname; else the attempt's task, with its --nodelist in SRUN_NODELIST
    "srun": '[ "${*: -2}" != "hostname --ip-address" ] || { echo 127.0.0.1; exit 0; }\n'
            'while [ "${1#--}" != "$1" ]; do case "$1" in --nodelist=*) export SRUN_NODELIST="${1#*=}" ;; esac; shift; '
            'done\nexec "$@"\n',
    "scontrol": "echo n1\n",
    "squeue": "echo 'n[1-3]'\n",
    "sinfo": "echo 'n1|idle|none'\n",
}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in SLURM.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}")
        (bin_dir / name).chmod(0o755)
    return tmp_path / "run"


def attempts(run_dir: Path, task: str, *options: str) -> subprocess.Popen[str]:
    """``slurm-attempts`` of a run whose attempt runs ``task`` (sh) through srun."""
    env = {"PATH": f"{run_dir.parent / 'bin'}:/usr/bin:/bin", "PYTHONPATH": str(ROOT / "tools"),
           "SLURM_JOB_ID": "7", "MLENV_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "mlenv.runtime", "slurm-attempts", "--run-dir", str(run_dir),
                             "--job-nodelist", "n1", *options, "--", "srun", "--label", "sh", "-c", task],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ended(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = process.communicate(timeout=60)
    return process.returncode, out


def test_a_failed_attempt_runs_again_while_restarts_are_left(run_dir: Path) -> None:
    code, out = ended(attempts(run_dir, 'echo "attempt $MLENV_RESTART_COUNT"; exit 3', "--max-restarts", "2"))
    assert code == 3, out
    assert out.startswith("mlenv: job 7 on n1, master n1 at 127.0.0.1:20014\nattempt 0\n"), out
    assert ("mlenv: attempt 0 failed with exit code 3: restarting the run, attempt 1 of at most 2 restarts "
            "(MLENV_RESTART_COUNT=1)\nattempt 1\n") in out
    assert "attempt 2\n" in out and "attempt 3" not in out
    assert (run_dir / "attempt").read_text() == "2\n"
    assert [(run_dir / f"attempt-{k}" / "exit").read_text() for k in range(3)] == ["3\n"] * 3
    assert (run_dir / "attempt-0" / "next").read_text() == "job 7 restarts the run\n"
    assert not (run_dir / "attempt-2" / "next").exists()
    assert (run_dir / "attempt-2" / "ended").read_text() == "failed\n"


def test_an_attempt_never_reuses_a_recorded_one_and_a_success_ends_the_run(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "attempt").write_text("4\n")
    code, out = ended(attempts(run_dir, 'echo "attempt $MLENV_RESTART_COUNT"', "--attempt", "1", "--max-restarts",
                               "3"))
    assert (code, out.splitlines()[1:]) == (0, ["attempt 5"])
    assert (run_dir / "attempt-5" / "exit").read_text() == "0\n" and (run_dir / "attempt").read_text() == "5\n"


def test_a_spare_of_the_allocation_takes_the_place_of_a_node_that_failed_first_twice(run_dir: Path) -> None:
    task = ('echo "on $SRUN_NODELIST"; [ "$SRUN_NODELIST" = n2,n3 ] && exit 0; '
            'echo "0 5" > "$MLENV_RUN_DIR/attempt-$MLENV_RESTART_COUNT/failed"; exit 5')
    code, out = ended(attempts(run_dir, task, "--max-restarts", "3", "--nodelist", "n1,n3", "--allocation",
                               "n1,n3,n2"))
    assert code == 0, out
    assert out.count("on n1,n3\n") == 2 and "mlenv: node 0 failed first, with exit code 5\n" in out
    assert ("mlenv: excluding n1 (node-0) from the next attempts: it failed first in 2 attempts of the run\n"
            "mlenv: job 7 on n2,n3, master n2 at 127.0.0.1:20014\n") in out, out
    assert (run_dir / "left").read_text() == "n1 0 saved=0 it failed first in 2 attempts of the run\n"
    assert (run_dir / "attempt-2" / "exit").read_text() == "0\n"


def test_an_attempt_that_mlenv_stop_stopped_ends_143_and_is_no_failure(run_dir: Path) -> None:
    code, out = ended(attempts(run_dir, 'touch "$MLENV_RUN_DIR/stop"; exit 1', "--max-restarts", "3"))
    assert code == 143 and "mlenv: attempt 0 stopped by mlenv stop (exit 1)\n" in out, out
    assert (run_dir / "attempt-0" / "ended").read_text() == "stopped\n"
    assert (run_dir / "attempt-0" / "exit").read_text() == "143\n" and not (run_dir / "attempt-1").exists()
    code, out = ended(attempts(run_dir, "exit 0", "--attempt", "1"))
    assert code == 143 and "mlenv: run stopped by mlenv stop: attempt 1 does not start\n" in out
    assert not (run_dir / "attempt-1").exists()


def test_a_signal_stops_the_running_attempt_with_143(run_dir: Path) -> None:
    process = attempts(run_dir, 'touch "$MLENV_RUN_DIR/started"; exec sleep 60', "--max-restarts", "3")
    deadline = time.monotonic() + 30
    while not (run_dir / "started").exists():
        assert time.monotonic() < deadline and process.poll() is None, "the attempt did not start"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGTERM)
    code, _ = ended(process)
    assert code == 143 and (run_dir / "attempt-0" / "exit").read_text() == "143\n"
    assert not (run_dir / "attempt-1").exists()
