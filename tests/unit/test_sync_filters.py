"""The rsync filter rules of `mlenv sync` against real rsync between two directories: names with wildcard
characters, backslashes and newlines are excluded exactly, and conflicts under such names are found and kept."""

from __future__ import annotations

from pathlib import Path

from mlenv.core.capabilities import CopyTarget
from mlenv.ops.sync import Plan, _copy, _dry_run, _list_directories, _stage_runtime, _type_changes

from tests._prereq import require

ODD = ["we ird*[x]", "a?b", "back\\slash", "new\nline", "plain"]
DECOYS = ["we irdZx", "aXb", "back\\\\slash"]
"""Names that each pattern of ODD would also match if its characters were taken as wildcards."""


def _copy_plan(tmp_path: Path) -> tuple[Plan, CopyTarget, Path]:
    source, stage, node = tmp_path / "source", tmp_path / "stage", tmp_path / "node"
    source.mkdir()
    stage.mkdir()
    node.mkdir()
    _stage_runtime(stage)
    return Plan(source, (), stage, delete=False), CopyTarget(f"{node}/"), node


def test_literal_names_exclude_only_themselves(tmp_path: Path) -> None:
    require("rsync")
    plan, target, node = _copy_plan(tmp_path)
    for name in ODD + DECOYS:
        (plan.source / name).write_text(name)
    run = _copy(plan, target, ODD, lambda line: None)
    assert run.code == 0, run.err
    assert sorted(p.name for p in node.iterdir() if p.name != ".mlenv") == sorted(DECOYS)


def test_conflicts_under_odd_names_are_found_and_kept(tmp_path: Path) -> None:
    require("rsync")
    plan, target, node = _copy_plan(tmp_path)
    for name in ODD:
        (plan.source / name).mkdir()
        (plan.source / name / "inside").write_text("x")
        (node / name).write_text("a file on the node")
    (plan.source / "fresh").mkdir()  # a directory the node does not have: no conflict
    directories = _list_directories(plan.source, (), tmp_path / "directories")
    assert directories is not None
    dry = _dry_run(plan, directories, target)
    assert dry.code == 0, dry.err
    conflicts = _type_changes(dry)
    assert sorted(conflicts) == sorted(ODD)
    run = _copy(plan, target, conflicts, lambda line: None)
    assert run.code == 0, run.err
    assert all((node / name).read_text() == "a file on the node" for name in ODD)
    assert (node / "fresh").is_dir()


def test_a_source_without_directories_needs_no_conflict_check(tmp_path: Path) -> None:
    require("rsync")
    plan, _, _ = _copy_plan(tmp_path)
    (plan.source / "train.py").write_text("x")
    (plan.source / ".git").mkdir()  # excluded: rsync never sends it
    assert _list_directories(plan.source, (), tmp_path / "directories") is None


def test_without_delete_only_the_runtime_loses_files(tmp_path: Path) -> None:
    require("rsync")
    plan, target, node = _copy_plan(tmp_path)
    plan = Plan(plan.source, ("+ keep.me", "*.log"), plan.stage, delete=False)
    (plan.source / "train.py").write_text("x")
    (plan.source / "run.log").write_text("left out")
    for name in ("keep.me", "old.txt", ".mlenv/owner", ".mlenv/mlenv/runtime/stale.py"):
        (node / name).parent.mkdir(parents=True, exist_ok=True)
        (node / name).write_text("on the node")
    run = _copy(plan, target, (), lambda line: None)
    assert run.code == 0, run.err
    assert sorted(str(p.relative_to(node)) for p in node.rglob("*") if p.is_file() and "runtime" not in p.parts) == [
        ".mlenv/mlenv/__init__.py", ".mlenv/owner", "keep.me", "old.txt", "train.py"]
    assert not (node / ".mlenv" / "mlenv" / "runtime" / "stale.py").exists()
    assert (node / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
