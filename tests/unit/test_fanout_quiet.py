"""What mlenv's fan-out (``run_parallel``) shows of the nodes' lines: one tag a line (a line its node's runtime tagged
already keeps that tag alone), a warning every process repeats once (``warnings_once``, as a launch asks), and
nothing of a node it is stopping (fail-fast), nor torchrun's traceback for the signal once a node's supervisor said
it stops its launcher: those lines go to the node's log only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlenv.parallel import node_line, run_parallel, warning_said
from mlenv.runtime.launchers import STOPPING

C10D = ("[W1127 20:05:04.798000 {pid} socket.cpp:752] [c10d] The hostname of the client socket cannot be retrieved. "
        "err=-3")


@pytest.mark.parametrize(("line", "shown"), [
    ("[node-1] Setting OMP_NUM_THREADS", "[node-1] Setting OMP_NUM_THREADS"),  # the launcher's, tagged there
    ("[node-1 r3] step 1", "[node-1 r3] step 1"),
    ("plain", "[node-1] plain"),
    ("[node-0] another node's tag", "[node-1] [node-0] another node's tag"),
])
def test_one_tag_a_line(line: str, shown: str) -> None:
    assert node_line(1, line) == shown


def test_a_warning_says_the_same_in_every_process() -> None:
    assert warning_said("[node-0 r1] " + C10D.format(pid=11)) == warning_said(C10D.format(pid=12)) is not None
    without_pid = ("[node-1 r3] [W1127 20:24:41.931045622 socket.cpp:207] [c10d] The hostname of the client socket "
                   "cannot be retrieved. err=-3")  # as torch 2.x writes it
    launcher = without_pid.replace("[node-1 r3]", "[node-0]").replace("41.9", "35.2")
    assert warning_said(without_pid) == warning_said(launcher) == ("socket.cpp [c10d] The hostname of the client "
                                                                    "socket cannot be retrieved. err=-3")
    python = "/x/torch/a.py:12: UserWarning: deprecated"
    assert warning_said(f"[node-1] {python}") == python
    assert warning_said("[node-1 r0] step 1 loss 2.0") is None


def _node(*lines: str, then: str = "") -> list[str]:
    return [sys.executable, "-c", f"import sys, time\nfor line in {list(lines)!r}: print(line, flush=True)\n{then}"]


def test_a_repeated_warning_is_shown_once_and_logged_always(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    logs = {n: tmp_path / f"node-{n}.log" for n in (0, 1)}
    commands = {n: _node(*(f"[node-{n} r{r}] " + C10D.format(pid=100 + r) for r in (2 * n, 2 * n + 1))) for n in (0, 1)}
    assert run_parallel(commands, logs=logs, warnings_once=True).exit_code == 0
    shown = capfd.readouterr().out.splitlines()
    assert len([line for line in shown if "[c10d]" in line]) == 1, shown
    assert [len(path.read_text().splitlines()) for path in logs.values()] == [2, 2]
    assert run_parallel(commands).exit_code == 0  # without warnings_once (exec, logs): every line
    assert len(capfd.readouterr().out.splitlines()) == 4


def test_a_node_stopped_by_fail_fast_says_nothing_more(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    teardown = ("import signal\n"
                "def bye(*_):\n    print('Traceback (most recent call last): teardown', flush=True); sys.exit(1)\n"
                "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)")
    ready = tmp_path / "ready"
    commands = {0: _node("waiting", then=f"import os\nwhile not os.path.exists({str(ready)!r}): time.sleep(0.05)\n"
                                         "print('failing', flush=True); sys.exit(7)"),
                1: _node(then=teardown.replace("print('ready', flush=True)",
                                               f"open({str(ready)!r}, 'w').close()"))}
    logs = {n: tmp_path / f"node-{n}.log" for n in (0, 1)}
    result = run_parallel(commands, fail_fast=True, logs=logs)
    assert (result.first_failure, result.exit_codes[0]) == (0, 7)
    shown = capfd.readouterr().out
    assert "[node-0] failing" in shown and "Traceback" not in shown, shown
    assert "teardown" in logs[1].read_text()


def _traceback(tag: str, last: str) -> list[str]:
    return [f"{tag} Traceback (most recent call last):", f'{tag}   File "run.py", line 9, in main',
            f"{tag}     time.sleep(monitor_interval)", f"{tag} {last}"]


def test_only_torchrun_s_traceback_for_the_signal_after_its_supervisor_stops_it_is_kept_off_the_terminal(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    signalled = "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15"
    child_failed = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: rank 1 failed"
    rank = _traceback("[node-0 r1]", "RuntimeError: failing on purpose")
    before = _traceback("[node-0]", signalled)  # not after a stop of the supervisor's: shown
    after = _traceback("[node-0]", signalled)
    real = _traceback("[node-0]", child_failed)
    lines = [*rank, *before, f"{STOPPING} with SIGTERM", *after[:2], "[node-0 r0] a rank's line meanwhile",
             *after[2:], *real, *after[:3]]  # the last traceback cut short: shown as it is
    log = tmp_path / "node-0.log"
    assert run_parallel({0: _node(*lines)}, logs={0: log}).exit_code == 0
    assert capfd.readouterr().out.splitlines() == [*rank, *before, "[node-0 r0] a rank's line meanwhile", *real,
                                                  *after[:3]]
    assert log.read_text().splitlines() == lines
