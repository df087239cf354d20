"""mlenv.fastschema against jsonschema itself: real objects, systematic mutations of them and hypothesis values
must get the same answer from the compiled validator and from jsonschema's Draft202012Validator (with the pattern
keyword of mlenv.fastschema.patterns, a pattern's $ the end of the value); plus the cache's behaviour."""

from __future__ import annotations

import json
import os
import random
import re
import stat
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from kubernetes_validate.utils import VersionNotSupportedError, latest_version
from mlenv import fastschema
from mlenv.backends.kubernetes.schemas import crd_schema
from mlenv.core.clusters import cluster_schema
from mlenv.fastschema import Unsupported, compiled, compiled_files, forget
from mlenv.fastschema.compiler import SUPPORTED, UNSUPPORTED, generate
from mlenv.fastschema.kubernetes import kubernetes_validator, schema_directory
from mlenv.fastschema.patterns import draft202012
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.helpers import MLENV

ROOT = Path(__file__).resolve().parents[2]
RENDERS = [("barcelona", "--mode", "rdma"), ("nerc-production", "--mode", "tcp"), ("template", "--mode", "rdma"),
           ("template", "--mode", "rdma", "--admin")]
KINDS = [("v1", "ServiceAccount"), ("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("apps/v1", "StatefulSet"),
         ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
         ("networking.k8s.io/v1", "NetworkPolicy")]
VERSIONS = ["1.30", latest_version()]
CRDS = [("security.openshift.io/v1", "SecurityContextConstraints"),
        ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")]
HANDWRITTEN: list[dict[str, Any]] = [
    {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "ml", "namespace": "ml"},
     "spec": {"podSelector": {"matchLabels": {"app": "ml"}}, "policyTypes": ["Ingress", "Egress"],
              "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "ml"}}},
                                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                           "ports": [{"protocol": "TCP", "port": 29500, "endPort": 29510}, {"port": "nccl"}]}],
              "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [
                  {"key": "team", "operator": "In", "values": ["a", "b"]}]}}]}]}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r", "labels": {"a": "b"}},
     "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get", "list", "create"]},
               {"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]},
    {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": "sriov-net1"},
     "spec": {"config": '{"cniVersion": "0.3.1", "type": "sriov"}'}},
]
SPECIAL = [None, True, False, 0, 1, -1, 1.0, 0.5, 2**64, -(2**70), "", "x", "é\U0001f600", [], {}, ["x"], {"x": 1}]


class Case(NamedTuple):
    """A compiled validator, the jsonschema validator it must agree with, and a valid seed instance."""

    label: str
    fast: Callable[[object], bool]
    reference: Validator
    seed: Any


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLENV_CACHE_DIR", str(tmp_path_factory.mktemp("validators")))
        yield


# ---------------------------------------------------------------- reference validators and seed instances


def schema_file(api_version: str, kind: str) -> str:
    """kubernetes-validate's file name for a kind, e.g. rolebinding-rbac-v1.json."""
    return kind.lower() + "-" + re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version) + ".json"


@cache
def k8s_reference(api_version: str, kind: str, version: str) -> Validator:
    """What kubernetes_validate.validate(obj, version, strict=True) builds for the kind (see its utils.py): plain
    jsonschema, which agrees since those schemas have no pattern (test_schema_patterns)."""
    directory = Path(str(schema_directory(version)))
    root = json.loads((directory / schema_file(api_version, kind)).read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(root) @ Registry())
    return Draft202012Validator(root, registry=registry)


def crd_validator(api_version: str, kind: str) -> Callable[[object], bool]:
    return compiled(f"test-crd|{api_version}|{kind}", lambda: (crd_schema(api_version, kind), {}))


@pytest.fixture(scope="session")
def rendered() -> list[dict[str, Any]]:
    """The objects `mlenv render` prints for real clusters."""
    objects: list[dict[str, Any]] = []
    for args in RENDERS:
        done = subprocess.run([str(MLENV), "render", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        objects += [obj for obj in yaml.safe_load_all(done.stdout) if obj]
    return objects


@pytest.fixture(scope="session")
def k8s_cases(rendered: list[dict[str, Any]]) -> list[Case]:
    cases = []
    for obj in rendered + HANDWRITTEN:
        key = (obj["apiVersion"], obj["kind"])
        for version in VERSIONS if key in KINDS else []:
            fast = kubernetes_validator(*key, version)
            assert fast is not None
            cases.append(Case(f"{obj['kind']}/{version}", fast, k8s_reference(*key, version), obj))
    assert {(case.seed["apiVersion"], case.seed["kind"]) for case in cases} == set(KINDS)
    return cases


@pytest.fixture(scope="session")
def crd_cases(rendered: list[dict[str, Any]]) -> list[Case]:
    objects = [obj for obj in rendered + HANDWRITTEN if (obj["apiVersion"], obj["kind"]) in CRDS]
    assert {(obj["apiVersion"], obj["kind"]) for obj in objects} == set(CRDS)
    return [Case(obj["kind"], crd_validator(obj["apiVersion"], obj["kind"]),
                 draft202012()(crd_schema(obj["apiVersion"], obj["kind"])), obj) for obj in objects]


@pytest.fixture(scope="session")
def cluster_cases() -> list[Case]:
    files = sorted((ROOT / "clusters").glob("*.yaml")) + sorted((ROOT / "tests/fixtures/clusters").glob("*.yaml"))
    assert len(files) >= 4
    schema = cluster_schema()  # cluster.schema.json composed with what the backends add
    fast = compiled("test-cluster-schema", lambda: (schema, {}))
    reference = draft202012()(schema)
    return [Case(path.name, fast, reference, yaml.safe_load(path.read_text())) for path in files]


# ---------------------------------------------------------------- mutations


Path_ = tuple[str | int, ...]
DELETE = object()


def walk(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every node of a JSON value with its path."""
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from walk(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from walk(child, (*path, index))


def edit(value: Any, path: Path_, new: Any) -> Any:
    """A copy of ``value`` with the node at ``path`` replaced by ``new`` (removed for DELETE); shares the rest."""
    if not path:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    child = edit(value[path[0]], path[1:], new)
    if child is DELETE:
        del copy[path[0]]
    else:
        copy[path[0]] = child
    return copy


def variants(node: Any) -> list[Any]:
    """Values to put where ``node`` is: wrong types, wrong enum values, extra fields, edge numbers."""
    extra: list[Any] = []
    if isinstance(node, str):
        extra = [node + "-", node.upper(), node[:1], node * 2, " " + node]
    elif isinstance(node, bool):
        extra = [int(node), str(node).lower()]
    elif isinstance(node, int):
        extra = [float(node), node + 0.5, str(node), -node, 2**63, True]
    elif isinstance(node, float):
        extra = [int(node), str(node)]
    elif isinstance(node, dict):
        extra = [{**node, "unexpectedField": "x"}, {**node, "name": "x"}, dict(list(node.items())[:1]), {}]
    elif isinstance(node, list):
        extra = [node + node[:1], [], [node], node[::-1]]
    return extra + SPECIAL


def mutants(seed: Any, rng: random.Random, per_node: int) -> Iterator[Any]:
    """The seed with one node deleted or replaced, for every node (``per_node`` random variants each)."""
    for path, node in walk(seed):
        if path:
            yield edit(seed, path, DELETE)
        options = variants(node)
        for new in rng.sample(options, min(per_node, len(options))):
            yield edit(seed, path, new)


def assert_agree(case: Case, instance: Any) -> bool:
    expected = case.reference.is_valid(instance)
    assert case.fast(instance) is expected, f"{case.label}: {instance!r}"
    return expected


def check_mutants(cases: list[Case], per_node: int) -> None:
    rng = random.Random(20240601)  # noqa: S311 - reproducible test data, not cryptography
    for case in cases:
        assert assert_agree(case, case.seed), f"{case.label}: the seed must be valid"
        answers = [assert_agree(case, mutant) for mutant in mutants(case.seed, rng, per_node)]
        assert True in answers and False in answers, case.label


def test_kubernetes_objects_and_their_mutants(k8s_cases: list[Case]) -> None:
    check_mutants(k8s_cases, per_node=2)


def test_crd_objects_and_their_mutants(crd_cases: list[Case]) -> None:
    check_mutants(crd_cases, per_node=8)


def test_cluster_files_and_their_mutants(cluster_cases: list[Case]) -> None:
    check_mutants(cluster_cases, per_node=8)


def test_rendered_objects_agree_with_kubernetes_validate(k8s_cases: list[Case]) -> None:
    """The reference set-up above is what kubernetes_validate.validate really does."""
    rng = random.Random(7)  # noqa: S311 - reproducible test data, not cryptography
    for case in [case for case in k8s_cases if case.label.endswith(f"/{VERSIONS[0]}")]:
        kind = (case.seed["apiVersion"], case.seed["kind"])  # kubernetes-validate picks the schema by these
        same_kind = [m for m in mutants(case.seed, rng, 2)
                     if isinstance(m, dict) and (m.get("apiVersion"), m.get("kind")) == kind]
        for instance in [case.seed, *rng.sample(same_kind, 4)]:
            try:
                kubernetes_validate.validate(instance, case.label.split("/")[1], strict=True)
                expected = True
            except kubernetes_validate.ValidationError:
                expected = False
            assert case.fast(instance) is expected, f"{case.label}: {instance!r}"


# ---------------------------------------------------------------- hypothesis


scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=6) | st.sampled_from(SPECIAL[:11]))
KEYS = st.text(max_size=6) | st.sampled_from(["name", "kind", "spec", "metadata", "type", "port", "items", "nodes"])
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)


def mutate(data: st.DataObject, seed: Any) -> Any:
    """One to three random edits of ``seed``: replace a node by any JSON value, delete one, add a key."""
    instance = seed
    for _ in range(data.draw(st.integers(1, 3))):
        path, node = data.draw(st.sampled_from(list(walk(instance))))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and path:
            instance = edit(instance, path, DELETE)
        elif action == "add" and isinstance(node, dict):
            instance = edit(instance, path, {**node, data.draw(KEYS): data.draw(json_values)})
        else:
            instance = edit(instance, path, data.draw(json_values))
    return instance


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(data=st.data())
def test_hypothesis_edits_of_kubernetes_objects(k8s_cases: list[Case], data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(k8s_cases))
    assert_agree(case, mutate(data, case.seed))


@PROPERTY
@given(data=st.data())
def test_hypothesis_edits_of_crd_objects_and_cluster_files(crd_cases: list[Case], cluster_cases: list[Case],
                                                          data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(crd_cases + cluster_cases))
    assert_agree(case, mutate(data, case.seed))


@PROPERTY
@given(data=st.data(), value=json_values)
def test_hypothesis_values_against_every_schema(k8s_cases: list[Case], crd_cases: list[Case],
                                                cluster_cases: list[Case], data: st.DataObject, value: Any) -> None:
    assert_agree(data.draw(st.sampled_from(k8s_cases + crd_cases + cluster_cases)), value)


SMALL_SCHEMAS: list[Any] = [
    True, False, {}, {"type": "integer"}, {"type": "number"}, {"type": ["integer", "null"]}, {"type": []},
    {"type": ["string", "boolean", "array", "object"]},
    {"enum": [0, 1, "a", None, True, 1.5, "b"]}, {"enum": ["only"]}, {"enum": []}, {"const": 0}, {"const": False},
    {"not": {"enum": [0]}}, {"not": {"enum": [""]}}, {"minimum": 1, "exclusiveMaximum": 10},
    {"type": "integer", "maximum": 5, "exclusiveMinimum": -2.5}, {"minLength": 2, "maxLength": 3},
    {"pattern": "^a+$"}, {"pattern": "b"}, {"pattern": "^[$a]+\\$$"}, {"pattern": "^a$|b"}, {"format": "ipv4"},
    {"items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"items": False}, {"items": {"items": {"type": "string"}}},
    {"properties": {"a": {"type": "string"}, "b": False}, "additionalProperties": {"type": "integer"}},
    {"properties": {"a": True}, "additionalProperties": False, "required": ["a"]}, {"additionalProperties": False},
    {"propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}}, {"propertyNames": False},
    {"oneOf": [{"type": "integer"}, {"minimum": 2}, True]}, {"anyOf": [{"type": "string"}, {"const": 1}]},
    {"allOf": [{"type": "object"}, {"required": ["x"]}, {"properties": {"x": {"type": "null"}}}]},
    {"anyOf": []}, {"oneOf": []}, {"allOf": []},
    {"if": {"type": "integer"}, "then": {"minimum": 3}, "else": {"type": "string"}},
    {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]}},
    {"if": {"minimum": 0}, "else": {"const": -5}}, {"then": False, "else": False}, {"if": False, "then": False},
    {"$defs": {"node": {"type": "object", "additionalProperties": False,
                        "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}}}},
     "$ref": "#/$defs/node"},
    {"$defs": {"a/b": {"type": "integer"}, "c~d": {"minimum": 3}, "e f": {"type": "number"}},
     "items": {"allOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}, {"$ref": "#/$defs/e%20f"}]}},
    {"properties": {"x": {"$ref": "#/properties/y"}, "y": {"type": "string"}}},
]


CORPUS: list[Any] = [*SPECIAL, 2, 3, 5, 10, 10.0, -2.5, -3, "a", "aa", "aaa", "ab", "abcd", "\U0001f600\U0001f600",
                     "a\n", "aa\n", "\n", "b\n", "\na", "a$", "a$\n", "$a$",
                     [1, 2], [1, "a"], [1, 2, 3, 4], [True], [0.0], [["s"]], [[1]], {"a": "s"}, {"a": 1}, {"b": 1},
                     {"a": "s", "c": 2}, {"x": None}, {"x": 0}, {"abcd": 1}, {"A": 1}, {"name": "n", "kids": []},
                     {"name": "n", "kids": [{"name": "m"}, {"kids": [{"name": 1}]}]}, {"name": "n", "kids": [{"x": 1}]}]


def small_validator(schema: Any) -> Callable[[object], bool]:
    return compiled("small|" + json.dumps(schema), lambda: (schema, {}))


@pytest.mark.parametrize("schema", SMALL_SCHEMAS, ids=lambda schema: json.dumps(schema)[:60])
def test_each_keyword(schema: Any) -> None:
    fast, reference = small_validator(schema), draft202012()(schema)
    answers = [fast(value) for value in CORPUS]
    assert answers == [reference.is_valid(value) for value in CORPUS]


@settings(max_examples=600, deadline=None)
@given(schema=st.sampled_from(SMALL_SCHEMAS), value=json_values)
def test_each_keyword_on_hypothesis_values(schema: Any, value: Any) -> None:
    assert small_validator(schema)(value) is draft202012()(schema).is_valid(value)


def test_refs_into_other_documents() -> None:
    root = {"$id": "https://example.com/schemas/root.json", "type": "array",
            "items": {"anyOf": [{"$ref": "common.json#/$defs/port"}, {"$ref": "/ids/named#/$defs/name"}]}}
    common = {"$defs": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}}}
    named = {"$id": "https://example.com/ids/named", "$defs": {"name": {"type": "string", "pattern": "^[a-z]+$"}}}
    documents = {"common.json": common, "other-name.json": named}
    fast = compiled("docs|test", lambda: (root, documents))
    registry = Registry().with_resource("https://example.com/schemas/common.json",
                                        Resource.from_contents(common, default_specification=DRAFT202012))
    reference = draft202012()(root, registry=DRAFT202012.create_resource(named) @ registry)
    for value in ([], [1, "abc"], [0], [65536], ["ABC"], ["abc\n"], [True], [1.0], [None], "x", [80, "http", 443]):
        assert fast(value) is reference.is_valid(value), value


# ---------------------------------------------------------------- coverage of the schemas mlenv uses


def test_keyword_tables_cover_jsonschema() -> None:
    assert set(Draft202012Validator.VALIDATORS) == SUPPORTED | UNSUPPORTED
    assert not SUPPORTED & UNSUPPORTED


def test_every_shipped_kubernetes_version_compiles() -> None:
    """All strict schema directories of kubernetes-validate, every kind mlenv renders: no Unsupported."""
    top = Path(str(schema_directory(VERSIONS[-1]))).parent
    directories = sorted(top.glob("v*-local-strict"))
    assert len(directories) >= 10
    for directory in directories:
        definitions = json.loads((directory / "_definitions.json").read_text())
        for api_version, kind in KINDS:
            root = json.loads((directory / schema_file(api_version, kind)).read_text())
            source = generate("test", root, {"_definitions.json": definitions})
            assert "def is_valid(x):" in source


def test_generated_code_is_plain_python() -> None:
    directory = Path(str(schema_directory("1.30")))
    root = json.loads((directory / "statefulset-apps-v1.json").read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())
    source = generate("readable", root, {"_definitions.json": definitions})
    assert "\ndef _io_k8s_api_apps_v1_StatefulSetSpec(x):\n    # https://kubernetes.io/api/_definitions.json#" in source
    assert "    if not x.keys() <= KEYS_" in source
    assert source.endswith("\nKEY = 'readable'\n")


@pytest.mark.parametrize("schema", [
    {"minProperties": 1}, {"properties": {"a": {"uniqueItems": True}}}, {"patternProperties": {"^a": {}}},
    {"prefixItems": [{}]}, {"dependentRequired": {}}, {"$dynamicRef": "#x"}, {"multipleOf": 2},
    {"$ref": "#/$defs/missing"}, {"$ref": "other.json"}, {"$ref": "#anchor"}, {"pattern": "("},
    {"type": "any"}, {"enum": [[1]]}, {"const": {"a": 1}}, {"minLength": 1.5}, {"minimum": "1"},
    {"properties": {"a": {"$id": "https://example.com/a", "type": "string"}}},
    {"items": {"$schema": "http://json-schema.org/draft-07/schema#"}},
    {"anyOf": None},  # what the Route CRD's spec.port.targetPort becomes after _strict_json_schema
    {"required": "name"}, {"properties": []}, {"additionalProperties": "no"}, 42,
], ids=repr)
def test_unsupported_schemas_are_refused(schema: Any) -> None:
    with pytest.raises(Unsupported):
        compiled("unsupported|" + repr(schema), lambda: (schema, {}))


# ---------------------------------------------------------------- Kubernetes lookup


@pytest.mark.parametrize("version", ["1.25", "1.30.7", "v1.33", "1.37", latest_version()])
def test_schema_directory_is_the_one_kubernetes_validate_picks(version: str) -> None:
    picked = kubernetes_validate.validate({"apiVersion": "v1", "kind": "ServiceAccount"}, version, strict=True)
    assert Path(str(schema_directory(version))).name.startswith(f"v{picked}.")


@pytest.mark.parametrize("version", ["1.4", "1.99", "1.24", "2.0"])
def test_versions_kubernetes_validate_refuses_have_no_validator(version: str) -> None:
    assert kubernetes_validator("v1", "ServiceAccount", version) is None
    with pytest.raises((VersionNotSupportedError, IndexError)):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ServiceAccount"}, version, strict=True)


def test_unknown_kind_has_no_validator() -> None:
    assert kubernetes_validator("example.com/v1", "Widget", "1.30") is None


# ---------------------------------------------------------------- the cache


SCHEMA = {"type": "object", "properties": {"port": {"type": "integer", "minimum": 1}}, "required": ["port"]}


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty private cache directory, and no validators held in memory."""
    monkeypatch.setenv("MLENV_CACHE_DIR", str(tmp_path / "cache"))
    forget()
    yield tmp_path / "cache"
    forget()


class CountingLoad:
    """A ``load`` that counts its calls."""

    def __init__(self, schema: Any = SCHEMA) -> None:
        self.schema = schema
        self.calls = 0

    def __call__(self) -> tuple[Any, dict[str, Any]]:
        self.calls += 1
        return self.schema, {}


def check_port_validator(validator: Callable[[object], bool]) -> None:
    assert validator({"port": 80}) and validator({"port": 80.0})
    assert not validator({"port": 0}) and not validator({"port": True}) and not validator({})


def cache_file(cache_dir: Path) -> Path:
    (path,) = cache_dir.glob("*.py")
    return path


def reseal(text: str) -> bytes:
    """``text`` with its checksum made valid again, as only a deliberate edit would."""
    body = text.encode().rpartition(b"# crc32 ")[0]
    return body + b"# crc32 %08x\n" % zlib.crc32(body)


def test_a_hit_does_not_call_load(cache_dir: Path) -> None:
    load = CountingLoad()
    check_port_validator(compiled("port", load))
    assert load.calls == 1 and cache_file(cache_dir).is_file()
    forget()

    def refuse() -> tuple[Any, dict[str, Any]]:
        raise AssertionError("load called on a hit")

    check_port_validator(compiled("port", refuse))


def test_a_hit_in_a_new_process_reads_no_schema_and_imports_no_jsonschema(cache_dir: Path,
                                                                          rendered: list[dict[str, Any]]) -> None:
    statefulset = next(obj for obj in rendered if obj["kind"] == "StatefulSet")
    assert kubernetes_validator("apps/v1", "StatefulSet", "1.30") is not None  # fills the cache
    code = ("import sys; from mlenv.fastschema.kubernetes import kubernetes_validator\n"
            "validator = kubernetes_validator('apps/v1', 'StatefulSet', '1.30')\n"
            f"print(validator({statefulset!r}), validator({{'spec': 1}}), "
            "[name for name in ('json', 'jsonschema', 'mlenv.fastschema.compiler', 'mlenv.fastschema.patterns')"
            " if name in sys.modules])")
    env = {**os.environ, "MLENV_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split("\n")[0] == "True False []"


@pytest.mark.parametrize("changed", ["compiler.py", "patterns.py"])
def test_a_change_to_the_code_generating_validators_rebuilds_them(cache_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   changed: str) -> None:
    copies = {Path(source).name: tmp_path / Path(source).name for source in fastschema.SOURCES}
    for source in fastschema.SOURCES:
        copies[Path(source).name].write_bytes(Path(source).read_bytes())
    monkeypatch.setattr(fastschema, "SOURCES", tuple(map(str, copies.values())))
    load = CountingLoad()
    compiled("port", load)
    before = cache_file(cache_dir)
    forget()
    os.utime(copies[changed], ns=(0, copies[changed].stat().st_mtime_ns + 1))
    check_port_validator(compiled("port", load))
    assert load.calls == 2 and cache_file(cache_dir) != before  # rebuilt under a new name; the stale file is gone


@pytest.mark.parametrize("corrupt", [
    lambda text: text[: len(text) // 2],
    lambda text: "",
    lambda text: text.replace("return False", "return True "),
    lambda text: text.replace("KEY = 'port'", "KEY = 'other'"),
    lambda text: "raise SystemExit(3)\n" + text,
], ids=["truncated", "empty", "edited", "other key", "hostile"])
def test_a_corrupt_cache_file_is_rebuilt(cache_dir: Path, corrupt: Callable[[str], str]) -> None:
    compiled("port", CountingLoad())
    path = cache_file(cache_dir)
    good = path.read_text()
    path.write_text(corrupt(good))
    forget()
    load = CountingLoad()
    check_port_validator(compiled("port", load))
    assert load.calls == 1 and path.read_text() == good


def test_a_resealed_file_for_another_key_is_not_used(cache_dir: Path) -> None:
    """Two keys whose file names collide: the key recorded in the file decides."""
    compiled("port", CountingLoad())
    path = cache_file(cache_dir)
    forget()
    compiled("other", CountingLoad({"type": "string"}))
    other = next(p for p in cache_dir.glob("*.py") if p != path)
    path.write_bytes(other.read_bytes())
    assert path.read_bytes() == reseal(other.read_text())
    forget()
    load = CountingLoad()
    check_port_validator(compiled("port", load))
    assert load.calls == 1


def test_corrupt_bytecode_is_rebuilt(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    compiled("port", CountingLoad())
    (pyc,) = (cache_dir / "__pycache__").glob("*.pyc")
    pyc.write_bytes(pyc.read_bytes()[:16] + b"\xff" * 64)
    forget()
    load = CountingLoad()
    check_port_validator(compiled("port", load))
    assert load.calls == 1


def test_without_a_writable_cache_it_compiles_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MLENV_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    forget()
    check_port_validator(compiled("port", CountingLoad()))
    assert list(tmp_path.iterdir()) == [blocker]
    forget()


def test_a_cache_directory_others_can_write_is_not_trusted(cache_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    compiled("port", CountingLoad())
    planted = cache_file(cache_dir)
    planted.write_bytes(reseal(planted.read_text().replace("return False", "return True ")))
    cache_dir.chmod(0o777)
    forget()
    load = CountingLoad()
    check_port_validator(compiled("port", load))
    assert load.calls == 1
    assert [p.name for p in (tmp_path / "xdg" / "mlenv" / "validators").glob("*.py")] == [planted.name]
    assert stat.S_IMODE((tmp_path / "xdg" / "mlenv" / "validators").stat().st_mode) == 0o700


def test_compiled_files_follow_their_files(cache_dir: Path, tmp_path: Path) -> None:
    root, definitions = tmp_path / "root.json", tmp_path / "defs.json"
    root.write_text(json.dumps({"$id": "https://example.com/root.json", "$ref": "defs.json#/$defs/port"}))
    definitions.write_text(json.dumps({"$defs": {"port": {"type": "integer", "minimum": 1}}}))
    assert compiled_files(str(root), str(definitions))(80) and not compiled_files(str(root), str(definitions))("80")
    definitions.write_text(json.dumps({"$defs": {"port": {"type": ["integer", "string"]}}}))
    assert compiled_files(str(root), str(definitions))("80")
    assert len(list(cache_dir.glob("*.py"))) == 2
