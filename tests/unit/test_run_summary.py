"""``status``'s one line about a run (``ops.status.summary``) says what is true: running or hung on how many nodes and
how to follow or stop it; once it ended, its state and exit code and where its output is, never "running on 0/2"."""

from __future__ import annotations

from mlenv.ops.status import summary

RECORDED = {"id": "r1", "script": "train.py", "started": "2026-11-27T20:00:00+00:00"}


def test_a_finished_run_says_how_it_ended_and_nothing_of_stopping_it() -> None:
    said = summary({"state": "succeeded", "attempt": 0, "exit_code": 0}, RECORDED,
                   {"0": "succeeded (0)", "1": "succeeded (0)"})
    assert said == "succeeded, exit code 0 (node-0 succeeded (0), node-1 succeeded (0)); mlenv logs r1 shows it"


def test_a_restarted_failed_run_counts_its_restarts_and_preemptions() -> None:
    said = summary({"state": "failed", "attempt": 3, "exit_code": 3}, {**RECORDED, "preemptions": 1},
                   {"0": "stopped (143)", "1": "failed (3)"})
    assert said.startswith("failed, attempt 3 (restarted 2x, preempted 1x; mlenv logs shows every attempt), "
                           "exit code 3 (node-0 stopped (143), node-1 failed (3))"), said


def test_a_hung_run_is_hung_on_its_nodes_and_a_running_one_running() -> None:
    hung = summary({"state": "hung", "attempt": 0}, RECORDED, {"0": "hung", "1": "running"})
    assert hung == "hung on 1/2 nodes (node-0 hung, node-1 running); mlenv stacks shows where, mlenv stop stops it"
    running = summary({"state": "running", "attempt": 0}, RECORDED, {"0": "running", "1": "running"})
    assert running.startswith("running on 2/2 nodes") and running.endswith("mlenv logs -f follows it, mlenv stop "
                                                                           "stops it")
    unknown = summary({}, RECORDED, {"0": "-", "1": "-"})
    assert unknown.startswith("state unknown (node-0 -, node-1 -)"), unknown
