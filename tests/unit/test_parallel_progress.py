"""mlenv's fan-out (``run_parallel``, what ``mlenv launch`` shows) relays a rank's progress bar live: its node's
supervisor updates the line in place (``\\r`` and the rank's tag again), and the terminal shows the bar's latest state,
tagged, before the line ends; then the line's last state, and other lines whole."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

# A node's supervisor drawing rank 0's bar: two states, then (once told) the last one and the line's end.
NODE = """\
import os, sys, time
sys.stdout.write("[node-0 r0] bar 1/3")
sys.stdout.flush()
sys.stdout.write("\\r[node-0 r0] bar 2/3")
sys.stdout.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.stdout.write("\\r[node-0 r0] bar 3/3\\n[node-0 r0] done\\n")
"""
FANOUT = """\
import sys
from mlenv.parallel import run_parallel
sys.exit(run_parallel({0: [sys.executable, "-c", sys.argv[1], sys.argv[2]]}).exit_code)
"""


def screen(output: bytes) -> list[str]:
    """What a terminal shows of ``output``: each line as its last ``\\r``-separated state left it."""
    return [line.rsplit("\r", 1)[-1] for line in output.decode().split("\n")]


def test_a_bar_shows_its_latest_state_before_its_line_ends(tmp_path: Path) -> None:
    go = tmp_path / "go"
    fanout = subprocess.Popen([sys.executable, "-c", FANOUT, NODE, str(go)], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert fanout.stdout is not None
    seen, deadline = b"", time.monotonic() + 60
    while b"[node-0 r0] bar 2/3" not in seen:  # shown while the node's line is unfinished
        assert time.monotonic() < deadline and fanout.poll() is None, seen
        if select.select([fanout.stdout], [], [], 1.0)[0]:
            seen += os.read(fanout.stdout.fileno(), 1 << 16)
    go.touch()
    rest, _ = fanout.communicate(timeout=60)
    assert fanout.returncode == 0
    assert screen(seen + rest) == ["[node-0 r0] bar 3/3", "[node-0 r0] done", ""]
