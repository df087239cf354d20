"""The one restart loop (runtime/records/attempts.py): real short processes as a run's attempts, each one's end
handed to the restart policy as the same facts, the loop going on, leaving a node out or stopping as it says."""

from __future__ import annotations

import subprocess  # nosec B404: fixed argv lists, never a shell
import sys
from collections.abc import Callable, Sequence

from mlenv.runtime.records.attempts import run_attempts
from mlenv.runtime.records.restartpolicy import AttemptEnd, History, Verdict
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.states import FaultSign, NodeFault

HOSTS = ("gpu-a", "gpu-b")
LOST = NodeFault(FaultSign.NODE_FAILURE, "Slurm took gpu-b out of the job")


def _attempt(code: int, last_line: str) -> tuple[int, list[str]]:
    """A real process that prints ``last_line`` and exits with ``code``: its exit code and its lines."""
    done = subprocess.run([sys.executable, "-c", f"print({last_line!r}); raise SystemExit({code})"],  # nosec B603
                          capture_output=True, text=True, check=False)
    return done.returncode, done.stdout.splitlines()


def _runner(plan: Sequence[tuple[int, str, bool]]) -> tuple[Callable[[int], AttemptEnd], list[int]]:
    """``start``: attempt K runs ``plan[K]`` (exit code, last line, whether the scheduler lost node 1 meanwhile) on
    node 1; the attempts started."""
    started: list[int] = []

    def start(attempt: int) -> AttemptEnd:
        started.append(attempt)
        wanted, line, lost = plan[attempt]
        code, lines = _attempt(wanted, line)
        first = None if code in (0, 143) else FirstFailure(3, 1, code, None, f"exited with {code}", lines)
        return AttemptEnd(code, attempt, first, host=HOSTS[1] if first else None, lost={1: LOST} if lost else {})

    return start, started


def _go_on(verdicts: list[Verdict | None]) -> Callable[[AttemptEnd, Verdict | None], int | None]:
    """The caller's part: the next attempt where the verdict brings one (node left out or not), the verdicts seen."""
    def go_on(end: AttemptEnd, verdict: Verdict | None) -> int | None:
        verdicts.append(verdict)
        return end.attempt + 1 if verdict is not None and verdict.stop is None else None
    return go_on


def test_a_failure_is_restarted_until_the_run_succeeds() -> None:
    start, started = _runner([(3, "step 1", False), (0, "done", False)])
    verdicts: list[Verdict | None] = []
    end, last = run_attempts(start, _go_on(verdicts), 0, 3)
    assert (started, end.exit_code, last) == ([0, 1], 0, None)
    first = verdicts[0]
    assert first is not None and first.left_out == () and first.history.failed_first == ("gpu-b",)


def test_the_same_error_twice_stops_the_loop_and_leaves_no_node_out() -> None:
    start, started = _runner([(3, "FileNotFoundError: data.bin", False)] * 3)
    verdicts: list[Verdict | None] = []
    _, last = run_attempts(start, _go_on(verdicts), 0, 3)
    assert started == [0, 1] and last is not None and last.left_out == ()
    assert last.stop is not None and "the same error in attempts 1 and 2: not restarting" in last.stop


def test_a_node_that_fails_first_twice_is_left_out_for_the_run_only() -> None:
    start, started = _runner([(3, "step 1", False), (3, "step 2", False), (0, "done", False)])
    verdicts: list[Verdict | None] = []
    run_attempts(start, _go_on(verdicts), 0, 3)
    assert started == [0, 1, 2]
    second = verdicts[1]
    assert second is not None
    assert [(out.node, out.reason, out.saved) for out in second.left_out] == [
        (1, "it failed first in 2 attempts of the run", False)]


def test_a_stop_with_a_lost_node_is_restarted_without_it_and_a_plain_stop_is_not() -> None:
    start, started = _runner([(143, "", True), (0, "done", False)])
    verdicts: list[Verdict | None] = []
    run_attempts(start, _go_on(verdicts), 0, 3)
    lost = verdicts[0]
    assert started == [0, 1] and lost is not None
    assert [(out.node, out.reason, out.saved) for out in lost.left_out] == [
        (1, "node failure: Slurm took gpu-b out of the job", True)]
    start, started = _runner([(143, "", False)])
    assert run_attempts(start, _go_on([]), 0, 3)[1] is None and started == [0]


def test_restarts_stop_at_the_limit_and_a_final_end_is_never_judged() -> None:
    start, started = _runner([(3, f"step {attempt}", False) for attempt in range(5)])
    end, last = run_attempts(start, _go_on([]), 0, 2)
    assert started == [0, 1, 2] and (end.attempt, last) == (2, None)

    def final(attempt: int) -> AttemptEnd:
        return AttemptEnd(_attempt(3, "x")[0], attempt, final=True)

    assert run_attempts(final, _go_on([]), 4, 9, History(("gpu-b",), "earlier")) == (AttemptEnd(3, 4, final=True),
                                                                                      None)
