"""A reader that goes away (`mlenv ... | head -1`) ends a command quietly with exit 0, as `head` expects of a writer:
no traceback, nothing on stderr; commands that stream output stop what they run."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from mlenv.parallel import run_parallel

from tests.helpers import MLENV, ROOT


def _to_a_gone_reader(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``mlenv ARGS`` writing into a pipe whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(MLENV), *args], stdout=write, stderr=subprocess.PIPE, cwd=ROOT, timeout=60,
                              check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [["list"], ["render", "local"], ["list", "--json"], ["--help"]])
def test_a_gone_reader_ends_the_command_quietly(args: list[str]) -> None:
    result = _to_a_gone_reader(*args)
    assert (result.returncode, result.stderr.decode()) == (0, "")


def test_real_head_reads_one_line() -> None:
    with subprocess.Popen([str(MLENV), "render", "local"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=ROOT) as writer:
        assert writer.stdout is not None
        head = subprocess.run(["head", "-1"], stdin=writer.stdout, capture_output=True, check=True, timeout=60)
        writer.stdout.close()
        _, errors = writer.communicate(timeout=60)
    assert head.stdout.count(b"\n") == 1 and (writer.returncode, errors) == (0, b"")


def test_streamed_commands_stop_when_stdout_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    os.close(read)
    gone = io.TextIOWrapper(io.FileIO(write, "w"), write_through=True)
    monkeypatch.setattr(sys, "stdout", gone)
    with pytest.raises(BrokenPipeError):
        run_parallel({0: ["yes"], 1: ["yes"]})  # endless: it returns only because it stopped them
    with contextlib.suppress(BrokenPipeError):
        gone.close()
