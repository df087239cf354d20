"""The replay cache of read-only commands: same bytes as a real run, invalidated by any input change."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

Run = Callable[..., CompletedProcess[str]]


@pytest.fixture
def home(tmp_path: Path, project_root: Path) -> Path:
    """A project root of our own, so the cache starts empty."""
    shutil.copytree(project_root / "clusters", tmp_path / "clusters")
    shutil.copytree(project_root / "manifests", tmp_path / "manifests")
    return tmp_path


def test_replayed_render_is_identical_and_tracks_the_cluster_file(home: Path, run_mlenv: Run) -> None:
    env = {"MLENV_HOME": str(home)}
    first = run_mlenv("render", "barcelona", "--mode", "rdma", env=env)
    assert first.returncode == 0 and list((home / ".mlenv/cache/cli").glob("*.bin"))
    replay = run_mlenv("render", "barcelona", "--mode", "rdma", env=env)
    assert (replay.stdout, replay.stderr) == (first.stdout, first.stderr)
    cluster = home / "clusters/barcelona.yaml"
    cluster.write_text(cluster.read_text().replace("default_nodes: 2", "default_nodes: 3"))
    changed = run_mlenv("render", "barcelona", "--mode", "rdma", env=env)
    assert "replicas: 3" in changed.stdout and "replicas: 2" in first.stdout


def test_failures_and_directory_output_are_never_cached(home: Path, run_mlenv: Run) -> None:
    env = {"MLENV_HOME": str(home)}
    assert run_mlenv("render", "nerc-production", "--mode", "rdma", env=env).returncode == 2
    assert run_mlenv("render", "barcelona", "-o", str(home / "out"), env=env).returncode == 0
    assert not (home / ".mlenv/cache/cli").exists()


def test_help_replay_matches(home: Path, run_mlenv: Run) -> None:
    env = {"MLENV_HOME": str(home)}
    first, second = run_mlenv("--help", env=env), run_mlenv("--help", env=env)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout and "Commands:" in first.stdout
