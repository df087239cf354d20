"""Who holds a hung job back, by collective sequence, from real flight recorder dumps of gloo ranks
(tests/fixtures/flight_recorder, recorded by PyTorch 2.13): the compact record each rank writes, then the verdict
over every rank's record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlenv.runtime.forensics import collectives
from mlenv.runtime.forensics.culprit import culprit

from tests._prereq import require

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flight_recorder"


def records(case: str, ranks: range = range(3)) -> dict[int, dict[str, Any]]:
    """Each rank's record as its recorder thread would write it from the real dump."""
    return {rank: {"groups": collectives.compact(json.loads((FIXTURES / f"{case}.rank{rank}.json").read_text()))}
            for rank in ranks}


def test_compact_keeps_each_group_in_sequence() -> None:
    groups = records("behind")[0]["groups"]
    assert [group["group"] for group in groups] == ["default_pg", "pg1"]
    default = groups[0]["entries"]
    assert [(seq, op, done) for seq, op, _, done in default] == [
        (1, "all_reduce", True), (2, "all_reduce", True), (3, "all_reduce", True), (4, "all_reduce", False)]
    assert all(entered > 1_700_000_000 * 10**9 for _, _, entered, _ in default)  # wall-clock ns
    assert len(collectives.compact(json.loads((FIXTURES / "behind.rank0.json").read_text()), keep=2)[0]["entries"]) == 2


def test_the_rank_that_never_arrived_is_named_with_where_it_is() -> None:
    verdict = culprit(records("behind"), where={2: "train.py:40 load_batch"})
    assert verdict.verdict == "behind"
    assert verdict.text == \
        "ranks 0-1 wait in all_reduce #4; rank 2 last completed #3 and is in train.py:40 load_batch"
    default = verdict.groups[0]
    assert default.waiting == (0, 1) and [b.rank for b in default.behind] == [2]


def test_a_subgroup_judges_only_its_members() -> None:
    verdict = culprit(records("running"))
    subgroup = next(group for group in verdict.groups if group.group == "pg1")
    assert subgroup.behind == () and subgroup.verdict == "running"  # rank 2 is no member: not blamed


def test_ranks_in_different_collectives_are_a_desync() -> None:
    verdict = culprit(records("desync"))
    assert verdict.verdict == "desync"
    assert verdict.text == "ranks disagree on collective #4: all_reduce on ranks 0-1, broadcast on rank 2"


def test_a_running_job_blames_nobody() -> None:
    verdict = culprit(records("running"))
    assert verdict.verdict == "running" and verdict.text == "no rank waits in a collective (newest: barrier #4)"


def test_no_collectives_recorded_says_so() -> None:
    assert culprit({0: {"groups": []}, 1: {"groups": []}}).text == "no collectives recorded"
    assert culprit({}).verdict == "none"


def test_every_rank_waiting_blames_the_collective_not_a_rank() -> None:
    waiting = records("behind", range(2))
    assert culprit(waiting).verdict == "all_waiting"
    assert "every rank waits in all_reduce #4" in culprit(waiting).text


def test_an_unreadable_or_torn_record_is_unknown_and_the_others_still_judged(tmp_path: Path) -> None:
    for rank, record in records("behind").items():
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"token": 5, **record}))
    (tmp_path / "rank1.json").write_text('{"groups": [{"group": "default_pg", "entries": [[1, "all_re')  # torn
    (tmp_path / "rank3.json").write_text('{"groups": [{"group": "default_pg", "entries": [["x"]]}]}')
    read = collectives.read(tmp_path, range(5))
    assert "unreadable collective record rank1.json" in read[1]["error"]
    assert read[3]["error"] == "unreadable collective record rank3.json: torn entries"
    assert read[4]["error"].startswith("no collective record")
    verdict = culprit(read)
    assert verdict.text.startswith("rank 0 waits in all_reduce #4; rank 2 last completed #3; unknown: rank 1: ")
    assert [u.rank for u in verdict.unknown] == [1, 3, 4]


def test_a_rank_that_does_not_answer_is_marked_stale(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps({"token": 1, **records("behind")[0]}))
    token = collectives.ask(tmp_path)
    started = time.monotonic()
    read = collectives.read(tmp_path, [0], token, wait=0.3)
    assert read[0]["stale"] is True and time.monotonic() - started >= 0.3


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("off", False), ("0", False), ("No", False)])
def test_one_switch_turns_the_record_off(value: str, on: bool) -> None:
    assert collectives.enabled({collectives.SWITCH_ENV: value}) is on
    environ = {collectives.FILE_ENV: "/nonexistent/rank0.json", collectives.SWITCH_ENV: value}
    if not on:
        assert collectives.start_recorder(environ) is None and collectives.FILE_ENV not in environ


def test_the_recorder_writes_what_torch_records_and_answers_a_request(tmp_path: Path) -> None:
    """The thread in a real gloo process of one rank: a record after the first all_reduce, a fresh one on
    request."""
    require("torch")
    script = tmp_path / "one.py"
    script.write_text(
        "import os, time, torch, torch.distributed as dist\n"
        "from mlenv.runtime.forensics.collectives import start_recorder\n"
        "start_recorder(os.environ)\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:0')\n"
        "dist.all_reduce(torch.ones(2)); dist.all_reduce(torch.ones(2))\n"
        "open(os.environ['READY'], 'w').close()\n"
        "while not os.path.exists(os.environ['DONE']): time.sleep(0.05)\n")
    record = tmp_path / "records" / "rank0.json"
    env = {**os.environ, collectives.FILE_ENV: str(record), "READY": str(tmp_path / "ready"),
           "DONE": str(tmp_path / "done"), "TORCH_FR_BUFFER_SIZE": "100"}
    process = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        token = collectives.ask(record.parent)
        read = collectives.read(record.parent, [0], token, wait=10)[0]
        assert "stale" not in read and read["token"] >= token and read["pid"] == process.pid, read
        assert [(seq, op, done) for seq, op, _, done in read["groups"][0]["entries"]] == [
            (1, "all_reduce", True), (2, "all_reduce", True)]
    finally:
        (tmp_path / "done").touch()
        assert process.wait(timeout=30) == 0
