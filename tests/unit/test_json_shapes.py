"""The JSON that docs/json.md documents is what the commands print: errors (a broken cluster file, a bad argument,
an unknown cluster) as {"ok": false, "errors": [...]} on stdout with exit 2, `validate` and `list`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_shaped, documented_shape, run_mlenv

BROKEN = """\
cluster:
  name: broken
  backend: kubernetes
gpus:
  per_node: -3
  default_nodes: abc
bogus: 1
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose clusters/ holds a broken file (five problems) and the checkout's local.yaml."""
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "broken.yaml").write_text(BROKEN)
    shutil.copy(ROOT / "clusters" / "local.yaml", tmp_path / "clusters" / "local.yaml")
    return tmp_path


def test_validate_of_a_broken_file_prints_every_error_as_json(project: Path) -> None:
    result = run_mlenv("validate", "--json", "broken", home=project, cwd=project)
    assert result.returncode == 2, result.stderr
    report = json.loads(result.stdout)
    assert_shaped(report, documented_shape("error"))
    assert report["ok"] is False
    assert [(e["file"], e["line"], e["column"], e["field"]) for e in report["errors"]] == [
        ("clusters/broken.yaml", 1, 1, "cluster"), ("clusters/broken.yaml", 3, 3, "cluster.backend"),
        ("clusters/broken.yaml", 5, 3, "gpus.per_node"), ("clusters/broken.yaml", 6, 3, "gpus.default_nodes"),
        ("clusters/broken.yaml", 7, 1, "bogus")]
    assert len(result.stderr.splitlines()) == 5  # a person still reads them on stderr, one a line


@pytest.mark.parametrize(("args", "code", "said"), [
    (["validate", "--json", "--nodes", "x", "broken"], 2, "Invalid value for '--nodes'"),
    (["status", "--json", "--cluster", "nowhere"], 2, "unknown cluster 'nowhere'"),
    (["stacks", "--json", "--cluster", "local"], 1, "is not deployed"),
    (["runs", "--json"], 2, "no deployment recorded"),
    (["logs", "--json", "20990101-000000-nope"], 2, "no deployment recorded"),
    (["drill", "--json", "--fault", "rank-exit"], 2, "no deployment recorded"),
    (["launch", "--json", "--cluster", "local", "--max-restarts", "x", "train.py"], 2,
     "Invalid value for '--max-restarts'"),
])
def test_every_error_of_a_json_command_is_json(project: Path, args: list[str], code: int, said: str) -> None:
    result = run_mlenv(*args, home=project, cwd=project)
    assert result.returncode == code, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert_shaped(report, documented_shape("error"))
    assert [(e["file"], e["line"], e["field"]) for e in report["errors"]] == [(None, None, None)]
    assert said in report["errors"][0]["message"], report


def test_validate_and_list_are_as_documented(project: Path) -> None:
    valid = json.loads(run_mlenv("validate", "--json", "local", home=project, cwd=project).stdout)
    assert_shaped(valid, documented_shape("validate"))
    assert valid["ok"] is True
    listed = run_mlenv("list", "--json", home=project, cwd=project)
    assert listed.returncode == 0, listed.stderr
    clusters = json.loads(listed.stdout)
    assert_shaped(clusters, documented_shape("list"))
    assert [(c["name"], c["valid"], len(c.get("errors", []))) for c in clusters] == [("broken", False, 5),
                                                                                   ("local", True, 0)]


def test_the_list_table_counts_the_other_problems(project: Path) -> None:
    piped = {key: value for key, value in os.environ.items() if key != "COLUMNS"}  # piped: nothing is cut
    shown = run_mlenv("list", home=project, cwd=project, env=piped).stdout
    assert "INVALID: clusters/broken.yaml:1:1: cluster: missing required field 'namespace'" in shown
    assert "and 4 more problems (mlenv validate broken)" in shown
