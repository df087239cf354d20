"""``status``'s one line about a run (``ops.status.summary``) says what is true: running or hung on how many nodes and
how to follow or stop it; once it ended, its state and exit code and where its output is, never "running on 0/2"."""

from __future__ import annotations

from dataclasses import replace

from mlenv.core.recorded import RecordedRun
from mlenv.ops.status import summary
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import NodeEnd, RunState

RECORDED = RecordedRun("r1", "train.py", started="2026-11-27T20:00:00+00:00")


def test_a_finished_run_says_how_it_ended_and_nothing_of_stopping_it() -> None:
    ended = NodeEnd(RunState.SUCCEEDED, 0)
    said = summary(RunRecord("r1", RunState.SUCCEEDED, 0, nodes={0: ended, 1: ended}, exit_code=0), RECORDED)
    assert said == "succeeded, exit code 0 (node-0 succeeded (0), node-1 succeeded (0)); mlenv logs r1 shows it"


def test_a_restarted_failed_run_counts_its_restarts_and_preemptions() -> None:
    said = summary(RunRecord("r1", RunState.FAILED, 3, nodes={0: NodeEnd(RunState.STOPPED, 143),
                                                               1: NodeEnd(RunState.FAILED, 3)}, exit_code=3),
                   replace(RECORDED, preemptions=1))
    assert said.startswith("failed, attempt 3 (restarted 2x, preempted 1x; mlenv logs shows every attempt), "
                           "exit code 3 (node-0 stopped (143), node-1 failed (3))"), said


def test_a_hung_run_is_hung_on_its_nodes_and_a_running_one_running() -> None:
    hung = summary(RunRecord("r1", RunState.HUNG, 0, nodes={0: NodeEnd(RunState.HUNG), 1: NodeEnd(RunState.RUNNING)}),
                   RECORDED)
    assert hung == "hung on 1/2 nodes (node-0 hung, node-1 running); mlenv stacks shows where, mlenv stop stops it"
    going = NodeEnd(RunState.RUNNING)
    running = summary(RunRecord("r1", RunState.RUNNING, 0, nodes={0: going, 1: going}), RECORDED)
    assert running.startswith("running on 2/2 nodes") and running.endswith("mlenv logs -f follows it, mlenv stop "
                                                                           "stops it")
    unknown = summary(RunRecord("r1", None, 0, nodes={0: None, 1: None}), RECORDED)
    assert unknown.startswith("state unknown (node-0 -, node-1 -)"), unknown
