"""Hostile or broken cluster files: each is one exact positioned line and bad input (exit 2), within small bounds of
time and memory, never a traceback. Merge keys, standard tags and YAML 1.2 strings keep working."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from mlenv.config.load import MAX_BYTES, parse_yaml
from mlenv.errors import ConfigError

from tests.helpers import MLENV
from tests.unit.config.files import BARCELONA, ROOT, edited, loaded, position, problems

Run = Callable[..., subprocess.CompletedProcess[str]]
TAG_MESSAGE = "is not allowed: a cluster file holds plain mappings, lists and values; remove the tag"
LEADING_ZERO = "has a leading zero, which YAML reads as an octal number; write"


def _alias_bomb(levels: int = 7, width: int = 9) -> str:
    """A tiny file whose aliases expand to width**levels values."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


# (id, replacements in the seed file, where the problem points, expected text after "file:line:col: ")
ROWS = [
    ("leading-zero", [("per_node: 4", "per_node: 010")], "010",
     f'gpus.per_node: 010 {LEADING_ZERO} 10, or "010" if you mean the text'),
    ("leading-zero-negative", [("cross_nic: \"1\"", "cross_nic: -01")], "-01",
     f'network.rdma.cross_nic: -01 {LEADING_ZERO} -1, or "-01" if you mean the text'),
    ("python-object-tag-on-mapping", [("resources:\n", "resources: !!python/object/new:os.system\n")], "!!python",
     f"resources: the YAML tag !!python/object/new:os.system {TAG_MESSAGE}"),
    ("set-tag", [("  gpu_nodes:\n", "  gpu_nodes: !!set\n")], "!!set",
     f"nodes.gpu_nodes: the YAML tag !!set {TAG_MESSAGE}"),
    ("omap-tag", [("gpus:\n", "gpus: !!omap\n")], "!!omap", f"gpus: the YAML tag !!omap {TAG_MESSAGE}"),
    ("custom-tag-on-sequence", [("  gpu_nodes:\n", "  gpu_nodes: !nodes\n")], "!nodes",
     f"nodes.gpu_nodes: the YAML tag !nodes {TAG_MESSAGE}"),
    ("custom-tag-on-scalar", [("per_node: 4", "per_node: !int 4")], "!int",
     f"gpus.per_node: the YAML tag !int {TAG_MESSAGE}"),
    ("zero-width-space-in-key", [("per_node: 4", "per\u200b_node: 4")], "per\u200b_node",
     "gpus.per\\u200b_node: unknown field; did you mean 'per_node'?"),
    ("cyrillic-look-alike-key", [("\nnodes:", "\nn\u043edes:")], "n\u043edes",
     "n\\u043edes: unknown field; did you mean 'nodes'?"),
    ("number-too-long", [("per_node: 4", "per_node: " + "9" * 5000)], "9999",
     "gpus.per_node: a number of 5000 characters is too long; quote it if it is text"),
    ("nul-byte", [("name: barcelona", "name: barce\x00lona")], "\x00",
     "invalid YAML: the character U+0000 (\\x00) is not allowed in YAML; remove it"),
    ("unclosed-bracket", [('devices: "mlx5_6,mlx5_7,mlx5_8,mlx5_9"', "devices: [mlx5_6, mlx5_7")], "[mlx5_6",
     "invalid YAML: '[' opened here is never closed (parser stopped at line 25)"),  # at the next key, interfaces:
    ("bad-indentation", [("  api: barcelona", " api: barcelona")], "cluster:",
     "invalid YAML: expected <block end>, but found '<block mapping start>' in a block mapping that starts here "
     "(parser stopped at line 4, column 2)"),
]


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_hostile_or_broken_yaml_is_one_exact_line(row: tuple[str, list[tuple[str, str]], str, str],
                                                  tmp_path: Path) -> None:
    _, replacements, anchor, message = row
    text = edited(BARCELONA, *replacements)
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, anchor)}: {message}"]


def test_alias_bomb_is_refused_within_a_small_memory_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert len(path.read_bytes()) < 470  # 9**7 = 4.8 million strings once expanded

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))

    result = subprocess.run([str(MLENV), "validate", str(path)], cwd=ROOT,
                            capture_output=True, text=True, preexec_fn=limit_memory, check=False, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: {path}:4:5: invalid YAML: aliases of this value expand to more than 10,000 "
                             f"nodes (an alias bomb?); write the values out or use fewer aliases\n")


def test_merge_key_bomb_spends_the_same_budget() -> None:
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: {j}" for j in range(9)) + "}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}" for i in range(1, 8)]
    with pytest.raises(ConfigError, match="aliases of this value expand to more than 10,000 nodes"):
        parse_yaml("\n".join(lines) + "\n", "bomb.yaml")


def test_nesting_deeper_than_64_levels_is_refused(tmp_path: Path) -> None:
    text = "notes: " + "[" * 500 + "]" * 500 + "\n"
    path = tmp_path / "deep.yaml"
    assert problems(path, text) == [
        f"{path}:1:{len('notes: ') + 64}: invalid YAML: nested deeper than 64 levels; a cluster file needs only a few"]


def test_file_over_one_mebibyte_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    assert problems(path, "#" * MAX_BYTES + "\n") == [
        f"{path}: file is larger than 1 MiB (1,048,577 bytes); a cluster file is a few KiB, is this the right file?"]


def test_text_that_is_not_utf8_points_at_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    assert problems(path, BARCELONA.replace("barcelona\n", "barcel\xf3na\n", 1).encode("latin-1")) == [
        f"{path}:3:{len('  name: barcel') + 1}: not UTF-8 text (byte 0xf3); save the file as UTF-8"]


def test_merge_keys_merge_and_explicit_keys_win(tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  requests:\n", "  requests: &requests\n"),
                  ("    memory: 256Gi\n    cpu: 64\n", "    memory: 256Gi\n    <<: *requests\n"))
    cluster = loaded(tmp_path / "merge.yaml", text)
    assert cluster.limits == {"memory": "256Gi", "cpu": "32"}
    assert cluster.where(("resources", "limits", "memory")) == (50, 5)  # written there
    assert cluster.where(("resources", "limits", "cpu")) == (48, 5)  # merged from requests


def test_a_problem_in_a_merged_value_points_where_it_is_written(tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  requests:\n    memory: 128Gi\n", "  requests: &requests\n    memory: 128GB\n"),
                  ("  limits:\n    memory: 256Gi\n    cpu: 64\n", "  limits:\n    <<: *requests\n    cpu: 64\n"))
    path = tmp_path / "merge.yaml"
    expected = 'expected a Kubernetes quantity such as 128Gi, 500Mi, 32 or 500m, got "128GB"'
    assert problems(path, text) == [f"{path}:47:5: resources.requests.memory: {expected}",
                                    f"{path}:47:5: resources.limits.memory: {expected}"]


def test_standard_tags_aliases_and_yaml12_strings_load(tmp_path: Path) -> None:
    text = edited(BARCELONA, ("per_node: 4", 'per_node: !!int "4"'), ("name: barcelona", "name: !!str barcelona"),
                  ("class_rwo: ocs", "class_rwo: &rbd ocs"), ("description: \"NERC", "description: 01:00:00\n# \""))
    cluster = loaded(tmp_path / "tags.yaml", text + "app:\n  name: *rbd\n")
    assert (cluster.gpus.per_node, cluster.info.name, cluster.app_name) == (4, "barcelona",
                                                                            "ocs-external-storagecluster-ceph-rbd")
    assert cluster.info.description == "01:00:00"  # YAML 1.1 would read the integer 3600
    assert parse_yaml("time: 01:00:00\nday: 2024-01-01\nsign: =\nhex: 0x1F\nzero: 0\n", "s.yaml").data == {
        "time": "01:00:00", "day": "2024-01-01", "sign": "=", "hex": 31, "zero": 0}


def test_duplicate_key_reached_through_an_alias_is_reported_once(tmp_path: Path) -> None:
    twice = "  requests: &r\n    memory: 128Gi\n    memory: 1Gi\n"
    text = edited(BARCELONA, ("  requests:\n    memory: 128Gi\n", twice),
                  ("  limits:\n    memory: 256Gi\n    cpu: 64\n", "  limits: *r\n"))
    path = tmp_path / "dup.yaml"
    assert problems(path, text) == [f"{path}:48:5: resources.requests.memory: duplicate key (first set on line 47); "
                                    f"keep only one, YAML would silently use the last"]


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_path_that_is_not_a_regular_file_is_refused_unread(kind: str, tmp_path: Path, run_mlenv: Run) -> None:
    if kind == "device":
        path, what = Path("/dev/zero"), "a character device"
    elif kind == "fifo":
        path, what = tmp_path / "pipe.yaml", "a named pipe"
        os.mkfifo(path)  # opening it for reading would block until a writer came
    else:
        path, what = tmp_path / "dir.yaml", "a directory"
        path.mkdir()
    result = run_mlenv("validate", str(path), timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"error: {path}: not a regular file ({what}); give the path of a cluster YAML file\n"


def test_a_newline_in_a_file_name_cannot_forge_a_line(tmp_path: Path, run_mlenv: Run) -> None:
    path = tmp_path / "x\nerror: all is fine.yaml"
    path.write_text("cluster: {name: x\n")
    result = run_mlenv("validate", str(path))
    assert result.returncode == 2
    assert result.stderr == (f"error: {tmp_path}/x\\nerror: all is fine.yaml:1:10: invalid YAML: '{{' opened here is "
                             f"never closed (parser stopped at line 2)\n")
