"""The stack sampler's own parts, on real processes: the faulthandler fallback (armed by the runtime's
sitecustomize, which chains to the image's own), the signal sent only to processes that catch it, a rank that is
gone while it is sampled, grouping and the one-line summaries."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.runtime.forensics.stacks import (
    DUMP_WAIT_SECONDS,
    FAULTHANDLER_FILE,
    STACK_SIGNAL,
    Frame,
    StackError,
    catches,
    group,
    parse_faulthandler,
    parse_py_spy,
    ranges,
    render,
    sample_rank,
    summary,
)
from mlenv.runtime.supervise.launcher import SITE_DIR

PROC = Path("/proc")
WAITER = """\
import sys, time
def waits_for_ever():
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
waits_for_ever()
"""


# Many threads started after the main one: faulthandler's dump of every thread holds the newest 100 only.
THREADS = """\
import signal, sys, threading
if sys.argv[1:] == ["--block"]:  # the main thread (and every thread it starts) blocks the main-thread signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN + 7})
never = threading.Event()
for _ in range(300):
    threading.Thread(target=never.wait, daemon=True).start()
"""


def _start(code: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"  # up, handler registered
    return process


@pytest.fixture
def image_site(tmp_path: Path) -> Path:
    """A directory with the image's own sitecustomize, which leaves a mark."""
    site = tmp_path / "image-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE_RAN'] = '1'\n")
    return site


def _rank_env(dump: Path, *more: Path) -> dict[str, str]:
    """The environment the runtime gives a rank: our site dir first on PYTHONPATH, its faulthandler file."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SITE_DIR, str(Path(SITE_DIR).parents[2]), *map(str, more)]),
            FAULTHANDLER_FILE: str(dump)}


@pytest.fixture
def armed(tmp_path: Path, image_site: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process started as the runtime starts a rank, under an image with a sitecustomize of its own."""
    dump = tmp_path / "stacks" / "faulthandler" / "rank3.txt"
    process = _start("import os\nassert os.environ.get('IMAGE_SITE_RAN') == '1'\n"
                     "assert 'MLENV_FAULTHANDLER_FILE' not in os.environ\n" + WAITER, _rank_env(dump, image_site))
    yield process, dump
    process.kill()
    process.wait()


def test_faulthandler_fallback_takes_the_main_thread_and_chains_the_image_site(
        armed: tuple[subprocess.Popen[str], Path]) -> None:
    process, dump = armed
    assert catches(process.pid, STACK_SIGNAL, PROC)
    rank = {"rank": 3, "local_rank": 1, "node": 1, "host": "h", "pid": process.pid}
    first = sample_rank(rank, native=False, method="faulthandler", dumps=dump.parent)
    second = sample_rank(rank, native=False, method="faulthandler", dumps=dump.parent)  # the newest dump is read
    for taken in (first, second):
        assert taken.method == "faulthandler" and taken.error is None and taken.state == "running"
        assert [f.function for f in taken.frames] == ["<module>", "waits_for_ever"]
    assert dump.read_text().startswith(f"mlenv: pid {process.pid} main thread 0x")
    assert process.poll() is None  # the signal did not hurt it


def test_a_rank_with_300_threads_gives_its_main_thread_s_stack(tmp_path: Path) -> None:
    """faulthandler dumps 100 threads, the newest first: the main thread's own dump is taken instead."""
    dump = tmp_path / "rank0.txt"
    process = _start(THREADS + WAITER, _rank_env(dump))
    try:
        taken = sample_rank({"rank": 0, "local_rank": 0, "node": 0, "host": "h", "pid": process.pid},
                            native=False, method="faulthandler", dumps=tmp_path)
        assert taken.error is None and [f.function for f in taken.frames] == ["<module>", "waits_for_ever"], taken
        assert "Stack (most recent call first):" in dump.read_text()  # the main thread's alone
    finally:
        process.kill()
        process.wait()


def test_a_dump_of_300_threads_without_the_main_one_says_so(tmp_path: Path) -> None:
    """Where the main thread cannot be sent its own signal (here: it blocks it), every thread's dump is read; the
    main thread is not among its 100: an error that says so, never another thread's stack."""
    dump = tmp_path / "rank0.txt"
    process = _start(THREADS + WAITER, _rank_env(dump), "--block")
    try:
        taken = sample_rank({"rank": 0, "local_rank": 0, "node": 0, "host": "h", "pid": process.pid},
                            native=False, method="faulthandler", dumps=tmp_path)
        assert taken.frames == [] and taken.state == "running", taken
        assert re.fullmatch(r"the main thread \(0x[0-9a-f]+\) is not in faulthandler's dump \(100 threads shown; "
                            r"faulthandler dumps at most 100, the newest first\)", str(taken.error)), taken.error
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_the_signal_goes_only_to_a_process_that_catches_it(tmp_path: Path) -> None:
    process = _start(WAITER, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        assert not catches(process.pid, STACK_SIGNAL, PROC)
        taken = sample_rank({"rank": 0, "local_rank": 0, "node": 0, "host": "h", "pid": process.pid},
                            native=False, method="faulthandler", dumps=tmp_path)
        assert taken.frames == [] and "does not catch SIGRTMIN+6" in str(taken.error)
        assert process.poll() is None  # still alive: it was never sent the signal
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("method", ["py-spy", "faulthandler", "auto"])
def test_a_stopped_rank_is_said_at_once(tmp_path: Path, method: str) -> None:
    """A SIGSTOPped rank would answer neither py-spy nor faulthandler (which waits for its dump): said, not waited
    for."""
    process = _start(WAITER, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while "T" not in (PROC / str(process.pid) / "stat").read_text().rpartition(")")[2].split()[:1]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        taken = sample_rank({"rank": 0, "local_rank": 0, "node": 0, "host": "h", "pid": process.pid},
                            native=False, method=method, dumps=tmp_path)
        assert taken.frames == [] and str(taken.error).startswith("the process is stopped (SIGSTOP"), taken
        assert time.monotonic() - started < DUMP_WAIT_SECONDS  # not the faulthandler wait
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("method", ["py-spy", "faulthandler", "auto"])
def test_a_rank_that_is_gone_is_reported_as_exited(tmp_path: Path, method: str) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    taken = sample_rank({"rank": 5, "local_rank": 1, "node": 2, "host": "h", "pid": gone.pid}, native=False,
                        method=method, dumps=tmp_path)
    assert (taken.state, taken.frames, taken.error) == ("exited", [], None)


def test_parse_faulthandler_keeps_the_latest_dump_of_the_main_thread() -> None:
    text = ("mlenv: pid 7 main thread 0x00007f0000000001\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n  File \"a.py\", line 1 in old\n\n"
            "Thread 0x00007f0000000002 (most recent call first):\n  File \"t.py\", line 9 in worker\n\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n"
            "  File \"a.py\", line 40 in load_batch\n  File \"a.py\", line 88 in <module>\n")
    assert parse_faulthandler(text) == [Frame("<module>", "a.py", 88), Frame("load_batch", "a.py", 40)]
    alone = "Stack (most recent call first):\n  File \"a.py\", line 41 in step\n  File \"a.py\", line 90 in <module>\n"
    assert parse_faulthandler(text + alone) == [Frame("<module>", "a.py", 90), Frame("step", "a.py", 41)]


def test_parse_py_spy_never_takes_another_thread_for_the_main_one() -> None:
    worker = {"thread_name": "Thread-1", "os_thread_id": None, "frames": [{"name": "wait", "filename": "t.py",
                                                                          "line": 3, "module": None}]}
    main = {**worker, "thread_name": "MainThread", "frames": [{"name": "step", "filename": "a.py", "line": 9}]}
    assert parse_py_spy(json.dumps([worker, main]), 7, False) == [Frame("step", "a.py", 9)]
    with pytest.raises(StackError, match="which of the process's 2 threads is its main thread"):
        parse_py_spy(json.dumps([worker, {**worker, "thread_name": None}]), 7, False)


def _stack(rank: int, node: int, *frames: tuple[str, str | None, int | None]) -> dict[str, object]:
    return {"rank": rank, "node": node, "frames": [{"function": f, "file": p, "line": n} for f, p, n in frames]}


def test_groups_odd_ones_first_and_summaries() -> None:
    step = [("<module>", "train.py", 100), ("step", "train.py", 88),
            ("all_reduce", "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252)]
    stacks = [_stack(r, r // 4, *step) for r in (0, 1, 2, 4, 5, 6, 7)]
    stacks.append(_stack(3, 0, ("<module>", "train.py", 100), ("load_batch", "data.py", 40)))
    stacks.append({"rank": 8, "node": 2, "frames": [], "state": "exited"})
    groups = group(stacks)
    assert [g["ranks"] for g in groups] == [[3], [8], [0, 1, 2, 4, 5, 6, 7]]
    assert render(groups).splitlines()[0] == "rank 3 (node-0): data.py:40 load_batch"
    assert "rank 8 (node-2): exited while being sampled" in render(groups)
    assert "ranks 0-2,4-7 (node-0, node-1): train.py:88 step → all_reduce" in render(groups)
    assert ranges([0, 2, 3, 9]) == "0,2-3,9"
    native = [{"function": "<module>", "file": "t.py", "line": 1}, {"function": "clock_nanosleep", "file": None,
                                                                      "line": None}]
    assert summary(native) == "t.py:1 <module>"
