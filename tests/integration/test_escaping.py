"""Values from a cluster file reach the terminal with their control characters escaped: a description (or a name)
holding every C0 control, DEL, ESC sequences, BEL and a bidi override can neither colour, move nor reorder what
``mlenv list``, ``validate`` and ``status`` print."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_mlenv

RAW = "".join(map(chr, range(0x20))) + "\x7f\x1b[31mRED\x1b[0m\x07 \u202e evil"
"""Every C0 control, DEL, an ANSI colour, BEL and U+202E (RIGHT-TO-LEFT OVERRIDE)."""
QUOTED = json.dumps(RAW)
"""As a YAML double-quoted scalar (YAML's escapes are a superset of JSON's)."""
FORBIDDEN = {chr(c) for c in range(0x20) if c != 0x0A} | {"\x7f", "\u202e"}


def _cluster(name: str, description: str) -> str:
    return f"""backend: local
cluster:
  name: {name}
  namespace: esc-ns
  description: {description}
gpus:
  per_node: 0
  default_nodes: 2
  procs_per_node: 1
local:
  subnet: 10.77.91.0/24
"""


def _raw(text: str) -> set[str]:
    return {char for char in text if char in FORBIDDEN}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "evil.yaml").write_text(_cluster("evil", QUOTED))
    (tmp_path / "clusters" / "bad.yaml").write_text(_cluster(json.dumps("bad\x1b[2J\u202e"), '"fine"'))
    return tmp_path


def test_list_prints_no_raw_control_character(home: Path) -> None:
    listed = run_mlenv("list", home=home)
    assert listed.returncode == 0, listed.stderr
    assert _raw(listed.stdout + listed.stderr) == set()
    assert "\\x1b[31mRED" in listed.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    rows = {row["name"]: row for row in json.loads(run_mlenv("list", "--json", home=home).stdout)}
    assert rows["evil"]["description"] == RAW  # JSON carries the value itself, escaped by JSON
    assert rows["bad"]["valid"] is False


def test_errors_quoting_a_value_escape_it(home: Path) -> None:
    refused = run_mlenv("validate", "bad", home=home)
    assert refused.returncode == 2
    assert _raw(refused.stdout + refused.stderr) == set() and "bad\\u001b[2J" in refused.stderr
    status = run_mlenv("status", "--cluster", "evil", home=home)
    assert _raw(status.stdout + status.stderr) == set()
