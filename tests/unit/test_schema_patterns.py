"""A schema pattern's ``$`` is the end of the value, as in JSON Schema (Python's ``$`` also matches before a final
newline): every pattern mlenv ships refuses a value it matches with a newline added, in the compiled validator and
in jsonschema's alike, and `mlenv validate` refuses such a name in a cluster file with one line and exit 2."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from mlenv.fastschema import compiled
from mlenv.fastschema.kubernetes import schema_directory
from mlenv.fastschema.patterns import draft202012

from tests.unit.config.files import BARCELONA, ROOT, edited, position

PACKAGE = ROOT / "tools/mlenv"
PREFIXES = {"^/": "the Route CRD's spec.path: a path starting with '/', whatever follows"}
"""Shipped patterns that are not anchored at the end: a newline after a matching value is valid there."""


def patterns_in(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """(pattern, where) for every ``pattern`` keyword under ``node`` (a property named "pattern" is a schema)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value, where
            else:
                yield from patterns_in(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from patterns_in(item, f"{where}/{index}")


def shipped_documents() -> Iterator[tuple[str, Any]]:
    """Every schema mlenv validates with: its own JSON schemas, the CRDs it ships and the strict Kubernetes
    schemas of kubernetes-validate that fastschema compiles."""
    own = sorted(PACKAGE.rglob("*.json"))
    assert {path.name for path in own} >= {"cluster.schema.json", "local.schema.json", "slurm.schema.json"}
    for path in own:
        yield str(path.relative_to(ROOT)), json.loads(path.read_text())
    crds = sorted((PACKAGE / "schemas/crds").glob("*.yaml"))
    assert len(crds) >= 4
    for path in crds:
        yield str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())
    kubernetes = sorted(Path(str(schema_directory("1.30"))).parent.glob("v*-local-strict"))
    assert len(kubernetes) >= 10
    for directory in kubernetes:
        yield f"{directory.name}/_definitions.json", json.loads((directory / "_definitions.json").read_text())


def shipped_patterns() -> dict[str, list[str]]:
    """Each pattern with the places it is used."""
    places: dict[str, list[str]] = defaultdict(list)
    for name, document in shipped_documents():
        for pattern, where in patterns_in(document, ""):
            places[pattern].append(f"{name}#{where}")
    return dict(places)


PATTERNS = shipped_patterns()


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLENV_CACHE_DIR", str(tmp_path_factory.mktemp("validators")))
        yield


def validators(pattern: str) -> list[Callable[[object], bool]]:
    """The compiled validator and jsonschema's for a string with ``pattern``."""
    schema = {"type": "string", "pattern": pattern}
    return [compiled(f"pattern|{pattern}", lambda: (schema, {})), draft202012()(schema).is_valid]


def test_the_walk_finds_the_patterns_of_each_kind_of_schema() -> None:
    places = [place for found in PATTERNS.values() for place in found]
    assert len(places) >= 60
    for file in ("config/cluster.schema.json", "backends/local.schema.json", "backends/runai.schema.json",
                 "backends/slurm.schema.json", "backends/ssh.schema.json",
                 "schemas/crds/routes.route.openshift.io.yaml"):
        assert any(place.startswith(f"tools/mlenv/{file}#") for place in places), file
    assert set(PREFIXES) <= set(PATTERNS)


@pytest.mark.parametrize("pattern", sorted(PATTERNS), ids=repr)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_value_a_shipped_pattern_matches_is_refused_with_a_newline_added(pattern: str, data: st.DataObject) -> None:
    value = data.draw(st.from_regex(pattern, fullmatch=True), label="value")
    checks = validators(pattern)
    assert [check(value) for check in checks] == [True, True], (
        f"no valid example derived for {pattern!r} (used at {PATTERNS[pattern]}): {value!r} is refused")
    assert [check(value + "\n") for check in checks] == [pattern in PREFIXES] * 2, PATTERNS[pattern]


@pytest.mark.parametrize(("pattern", "value", "valid"), [
    ("^a+$", "a", True), ("^a+$", "a\n", False), ("^a+$", "a\nb", False), ("b", "b\n", True),
    ("^a$|b", "a\n", False), ("^a$|b", "a\nb", True), ("(^a$)", "a\n", False),
    ("^[$a]+$", "$a", True), ("^[$a]+$", "$\n", False), ("^a\\$$", "a$", True), ("^a\\$$", "a$\n", False),
    ("^[^]$]+$", "x\n", True), ("^[]$]+$", "]$", True), ("^[]$]+$", "$\n", False), ("^[\\]$]$", "]", True),
    ("^[^\\s]+$", "x\n", False), ("^\\S{0,3}$", "", True), ("^\\S{0,3}$", "\n", False),
], ids=repr)
def test_a_dollar_is_the_end_of_the_value(pattern: str, value: str, valid: bool) -> None:
    """What JSON Schema (ECMA-262) answers; a "$" in a character class or escaped is a dollar sign."""
    assert [check(value) for check in validators(pattern)] == [valid, valid]


Run = Callable[..., CompletedProcess[str]]
DNS_LABEL = ("a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters, starting and ending with "
             "a letter or digit)")
KUEUE = "scheduling:\n  admission: kueue\n  queue: q\n"
# (id, replace-this, with-this, position-of, expected message after "file:line:col: ")
NEWLINE_CASES = [
    ("cluster.name", "name: barcelona", 'name: "barcelona\\n"', "name:",
     f'cluster.name: expected {DNS_LABEL}, got "barcelona\\n"'),
    ("app.name", "nodes:\n", 'app:\n  name: "x\\n"\nnodes:\n', "name: \"x",
     f'app.name: expected {DNS_LABEL}, got "x\\n"'),
    ("scheduling.queue", "nccl:\n", 'scheduling:\n  admission: kueue\n  queue: "q\\n"\nnccl:\n', "queue:",
     "scheduling.queue: expected a queue name: lower-case letters, digits and '-', at most 63 characters, "
     'got "q\\n"'),
    ("scheduling.priority_class", "nccl:\n", f'{KUEUE}  priority_class: "high\\n"\nnccl:\n', "priority_class:",
     "scheduling.priority_class: expected a PriorityClass name: lower-case letters, digits, '-' and '.', "
     'got "high\\n"'),
    ("scheduling.topology.required", "nccl:\n",
     f'{KUEUE}  topology:\n    required: "topology.kubernetes.io/zone\\n"\nnccl:\n', "required:",
     'scheduling.topology.required: expected a node label key like topology.kubernetes.io/zone, '
     'got "topology.kubernetes.io/zone\\n"'),
]


@pytest.mark.parametrize("case", NEWLINE_CASES, ids=[case[0] for case in NEWLINE_CASES])
def test_validate_refuses_a_name_ending_in_a_newline(case: tuple[str, str, str, str, str], tmp_path: Path,
                                                     run_mlenv: Run) -> None:
    _, old, new, anchor, message = case
    without = tmp_path / "without.yaml"
    without.write_text(edited(BARCELONA, (old, new.replace("\\n", ""))))
    assert run_mlenv("validate", "--cluster", str(without)).returncode == 0
    text = edited(BARCELONA, (old, new))
    path = tmp_path / "x.yaml"
    path.write_text(text)
    result = run_mlenv("validate", "--cluster", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {path}:{position(text, anchor)}: {message}"]
