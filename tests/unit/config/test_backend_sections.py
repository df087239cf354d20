"""Validation generic over the backend registry (enum, sections, settings parsers, backend-dependent rules) and the
common sections env, container, network.tcp.interfaces, network.expected_busbw and security's new fields."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlenv.backends.kubernetes.rules import KubernetesSettings
from mlenv.backends.local.settings import LocalSettings
from mlenv.config.model import Bind, Container
from mlenv.core.clusters import cluster_schema
from mlenv.core.registry import BACKENDS

from tests.unit.config.files import BARCELONA, LOCAL, ROOT, edited, loaded, position, problems

TEMPLATE = (ROOT / "clusters/template.yaml").read_text()
ENV_NAME = "an environment variable name (letters, digits and '_', not starting with a digit)"


def _with(base: str, section: str) -> str:
    """``base`` with ``section`` (YAML text) added before its nccl: section."""
    return edited(base, ("nccl:\n", f"{section}nccl:\n"))


def test_backend_names_and_sections_come_from_the_registry() -> None:
    on_disk = json.loads((ROOT / "tools/mlenv/config/cluster.schema.json").read_text())
    assert "enum" not in on_disk["properties"]["backend"]
    schema = cluster_schema()
    assert schema["properties"]["backend"]["enum"] == list(BACKENDS)
    assert list(BACKENDS)[:3] == ["openshift", "kubernetes", "local"]
    assert schema["properties"]["local"] == json.loads((ROOT / "tools/mlenv/backends/local.schema.json").read_text())


def editor_validator() -> Any:
    """What an editor does with a cluster file's ``yaml-language-server: $schema=`` line: the on-disk schema at its
    file URI, each ``$ref`` (to a backend's fragment, and back) resolved as a file beside it."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    def retrieve(uri: str) -> Resource[Any]:
        assert uri.startswith("file://"), uri
        return DRAFT202012.create_resource(json.loads(Path(uri[len("file://"):]).read_text()))  # the root's dialect

    root = (ROOT / "tools/mlenv/config/cluster.schema.json").resolve().as_uri()
    return Draft202012Validator({"$ref": root}, registry=Registry(retrieve=retrieve))  # type: ignore[call-arg]


def test_editors_see_every_backend_section_of_the_committed_files() -> None:
    on_disk = json.loads((ROOT / "tools/mlenv/config/cluster.schema.json").read_text())
    sections = {info.section: info.name for info in BACKENDS.values() if info.section}
    assert {key: value["$ref"] for key, value in on_disk["properties"].items()
            if value.get("$ref", "").startswith("../backends/")} == {
        section: f"../backends/{name}.schema.json" for section, name in sections.items()}
    validator = editor_validator()
    for path in sorted((ROOT / "clusters").glob("*.yaml")):
        text = path.read_text()
        assert text.startswith("# yaml-language-server: $schema=../tools/mlenv/config/cluster.schema.json\n")
        assert [e.message for e in validator.iter_errors(yaml.safe_load(text))] == [], path.name
    lab = yaml.safe_load((ROOT / "clusters/lab.yaml").read_text())
    lab["ssh"]["hostz"] = lab["ssh"].pop("hosts")
    assert {tuple(e.path) for e in validator.iter_errors(lab)} == {("ssh",)}


def test_unknown_backend_lists_the_registered_ones(tmp_path: Path) -> None:
    text = "backend: slurmm\n" + BARCELONA
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [
        f'{path}:1:1: backend: expected one of {", ".join(BACKENDS)}, got "slurmm"']


def test_a_backend_fragment_reports_like_the_common_schema(tmp_path: Path) -> None:
    text = edited(LOCAL, ("isolation: auto", "isolation: bogus"), ("  subnet:", "  subnt:"))
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [
        f'{path}:{position(text, "isolation: bogus")}: local.isolation: expected auto, namespaces or processes, '
        f'got "bogus"',
        f"{path}:{position(text, 'subnt')}: local.subnt: unknown field; did you mean 'subnet'?"]


def test_local_settings_are_parsed_by_the_backend(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "local.yaml", LOCAL)
    assert cluster.settings == LocalSettings(isolation="auto", interfaces=("ens1f1", "ens1f0np0"),
                                             subnet="10.77.0.0/24", root=None)
    assert loaded(tmp_path / "x.yaml", BARCELONA).settings == KubernetesSettings(version="1.30")  # kubernetes_version


def test_an_impossible_local_subnet_is_an_error_at_its_line(tmp_path: Path) -> None:
    text = edited(LOCAL, ("subnet: 10.77.0.0/24", "subnet: 10.999.0.0/24"))
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [
        f"{path}:{position(text, 'subnet')}: local.subnet: expected a private IPv4 subnet like 10.77.0.0/24, got "
        f"\"10.999.0.0/24\" (Octet 999 (> 255) not permitted in '10.999.0.0')"]


def test_sections_the_backend_does_not_read_are_warnings(tmp_path: Path) -> None:
    extra = "resources:\n  limits:\n    memory: 8Gi\nkubernetes_version: '1.10'\n"
    local = loaded(tmp_path / "l.yaml", _with(LOCAL, extra))
    assert local.warnings == ("resources: is ignored: backend local does not use it",
                              "kubernetes_version: is ignored: backend local does not use it")
    openshift = loaded(tmp_path / "o.yaml", _with(BARCELONA, "local:\n  isolation: auto\ncontainer:\n  image: x.sif\n"))
    assert openshift.warnings[:2] == ("local: is ignored: backend is openshift",
                                      "container: is ignored: backend openshift does not use it")


def test_namespace_and_storage_class_are_required_only_where_the_backend_needs_them(tmp_path: Path) -> None:
    local = loaded(tmp_path / "l.yaml", edited(LOCAL, ("  namespace: mlenv-local\n", "")))
    assert local.info.namespace is None and local.storage.storage_class is None and local.gpus.per_node == 0
    text = "backend: kubernetes\n" + edited(BARCELONA, ("  namespace: nccl-test\n", ""))
    path = tmp_path / "k.yaml"
    assert problems(path, text) == [
        f"{path}:{position(text, 'cluster:')}: cluster: missing required field 'namespace'; add it "
        f"(see clusters/template.yaml)"]


def test_env_values_become_text(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "x.yaml", _with(BARCELONA, "env:\n  OMP_NUM_THREADS: 8\n  HF_HOME: /data/hf\n"
                                                           "  _DEBUG: true\n  RATIO: 0.5\n"))
    assert cluster.env == {"OMP_NUM_THREADS": "8", "HF_HOME": "/data/hf", "_DEBUG": "1", "RATIO": "0.5"}


@pytest.mark.parametrize(("entry", "anchor", "message"), [
    ("NCCL_IB_HCA: mlx5_0", "NCCL_IB_HCA", "env.NCCL_IB_HCA: NCCL_IB_HCA is an NCCL setting: put it under nccl.env"),
    ("MASTER_ADDR: node-0", "MASTER_ADDR",
     "env.MASTER_ADDR: MASTER_ADDR is set by mlenv on every node (ranks and rendezvous); remove it"),
    ("LOCAL_WORLD_SIZE: 4", "LOCAL_WORLD_SIZE",
     "env.LOCAL_WORLD_SIZE: LOCAL_WORLD_SIZE is set by mlenv on every node (ranks and rendezvous); remove it"),
    ("MLENV_NODE_RANK: 0", "MLENV_NODE_RANK",
     "env.MLENV_NODE_RANK: MLENV_NODE_RANK is set by mlenv on every node (ranks and rendezvous); remove it"),
    ("1BAD: x", "1BAD", f'env.1BAD: expected {ENV_NAME}, got key "1BAD"'),
    ("HF_HOME: [a]", "HF_HOME", 'env.HF_HOME: expected a string, number or boolean, got ["a"]'),
])
def test_env_names_mlenv_owns_or_that_are_not_names_are_refused(entry: str, anchor: str, message: str,
                                                                tmp_path: Path) -> None:
    text = _with(BARCELONA, f"env:\n  {entry}\n")
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, anchor)}: {message}"]


CONTAINER = """container:
  runtime: singularity
  image: docker://nvcr.io/nvidia/pytorch:25.01-py3
  nv: false
  binds:
    - {host: /shared/datasets, container: /datasets, options: ro}
    - {host: /scratch, container: /scratch}
  env:
    PYTHONPATH: /workspace:$PYTHONPATH
"""


def test_container_section_builds_the_model(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "x.yaml", _with(BARCELONA, CONTAINER))
    assert cluster.container == Container(
        runtime="singularity", image="docker://nvcr.io/nvidia/pytorch:25.01-py3", nv=False,
        binds=(Bind("/shared/datasets", "/datasets", "ro"), Bind("/scratch", "/scratch", "rw")),
        env={"PYTHONPATH": "/workspace:$PYTHONPATH"})
    assert loaded(tmp_path / "y.yaml", BARCELONA).container is None


def test_the_template_documents_a_valid_container_section(tmp_path: Path) -> None:
    block = re.search(r"^# container:\n(?:#   .*\n)+", TEMPLATE, re.MULTILINE)
    assert block is not None
    uncommented = re.sub(r"^# ?", "", block.group(0), flags=re.MULTILINE)
    cluster = loaded(tmp_path / "t.yaml", TEMPLATE.replace(block.group(0), uncommented))
    assert cluster.container == Container(runtime="apptainer", image="/shared/images/pytorch.sif", nv=True,
                                          binds=(Bind("/shared/datasets", "/datasets", "ro"),),
                                          env={"PYTHONPATH": "/workspace:$PYTHONPATH"})
    assert "container: is ignored: backend openshift does not use it" in cluster.warnings


@pytest.mark.parametrize(("old", "new", "anchor", "message"), [
    ("image: docker://nvcr.io/nvidia/pytorch:25.01-py3", "image: nvcr.io/nvidia/pytorch:25.01-py3", "image:",
     "container.image: expected a .sif file or a docker://, oras:// or library:// reference, without spaces, got "
     '"nvcr.io/nvidia/pytorch:25.01-py3"'),
    ("host: /scratch,", "host: scratch,", "host: scratch",
     "container.binds[1].host: expected an absolute path without spaces, ':' or ',', got \"scratch\""),
    ("options: ro}", "options: readonly}", "options: readonly",
     'container.binds[0].options: expected ro or rw, got "readonly"'),
    ("  image: docker://nvcr.io/nvidia/pytorch:25.01-py3\n", "", "container:",
     "container: missing required field 'image'; add it (see clusters/template.yaml)"),
    ("runtime: singularity", "runtime: docker", "runtime",
     'container.runtime: expected apptainer or singularity, got "docker"'),
])
def test_bad_container_fields_are_one_line(old: str, new: str, anchor: str, message: str, tmp_path: Path) -> None:
    text = _with(BARCELONA, edited(CONTAINER, (old, new)))
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, anchor)}: {message}"]


def test_tcp_interfaces_map_hosts_to_interfaces(tmp_path: Path) -> None:
    text = edited(BARCELONA, ('p2p_level: "NVL"', 'p2p_level: "NVL"\n    interfaces: {gpu-node-1: ens1f0np0}'))
    assert loaded(tmp_path / "x.yaml", text).tcp.interfaces == {"gpu-node-1": "ens1f0np0"}
    text = edited(BARCELONA, ('p2p_level: "NVL"', 'p2p_level: "NVL"\n    interfaces: {gpu-node-1: ens1f0np0toolong}'))
    path = tmp_path / "y.yaml"
    assert problems(path, text) == [
        f"{path}:{position(text, 'gpu-node-1')}: network.tcp.interfaces.gpu-node-1: expected a network interface "
        f'name of at most 15 characters, like ens1f0np0, got "ens1f0np0toolong"']


@pytest.mark.parametrize(("value", "gbytes"), [
    ("180GB/s", 180.0), ("1440Gb/s", 180.0), ("500MB/s", 0.5), ("800Mb/s", 0.1), ("1.6TB/s", 1600.0),
    ("3.2Tb/s", 400.0), ('"25 GB/s"', 25.0),
])
def test_expected_busbw_is_converted_to_gigabytes_per_second(value: str, gbytes: float, tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  tcp:\n", f"  expected_busbw: {value}\n  tcp:\n"))
    assert loaded(tmp_path / "x.yaml", text).expected_busbw_gbytes == pytest.approx(gbytes)


@pytest.mark.parametrize(("value", "message"), [
    ("180", "180 has no unit: write 180GB/s for gigabytes per second (what nccl-tests reports as busbw) or 180Gb/s "
            "for gigabits (how NICs are rated; 8 bits make a byte)"),
    ('"180"', "180 has no unit: write 180GB/s for gigabytes per second (what nccl-tests reports as busbw) or "
              "180Gb/s for gigabits (how NICs are rated; 8 bits make a byte)"),
    ("180GiB/s", 'expected a bandwidth like 180GB/s or 1440Gb/s (bytes: MB/s, GB/s, TB/s; bits: Mb/s, Gb/s, Tb/s), '
                 'got "180GiB/s"'),
    ("0GB/s", 'expected a bandwidth larger than 0, got "0GB/s"'),
])
def test_expected_busbw_needs_a_unit(value: str, message: str, tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  tcp:\n", f"  expected_busbw: {value}\n  tcp:\n"))
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, 'expected_busbw')}: network.expected_busbw: {message}"]


def test_security_network_policy_and_run_as_user(tmp_path: Path) -> None:
    default = loaded(tmp_path / "x.yaml", BARCELONA).security
    assert (default.network_policy, default.run_as_user) == (True, None)
    text = edited(BARCELONA, ("  ipc_lock: true\n", "  ipc_lock: true\n  network_policy: false\n  run_as_user: 1000\n"))
    security = loaded(tmp_path / "y.yaml", text).security
    assert (security.network_policy, security.run_as_user) == (False, 1000)


@pytest.mark.parametrize(("value", "message"), [
    ("2147483648", "expected a user id 0-2147483647, got 2147483648"),
    ('"2147483648"', 'expected an integer 0-2147483647, got "2147483648"'),
    ("-1", "expected a user id 0-2147483647, got -1"),
])
def test_run_as_user_out_of_range(value: str, message: str, tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  ipc_lock: true\n", f"  ipc_lock: true\n  run_as_user: {value}\n"))
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, 'run_as_user')}: security.run_as_user: {message}"]


@pytest.mark.parametrize("value", ["rdma", "sockets", "any"])
def test_expect_transport_is_read(value: str, tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  tcp:\n", f"  expect_transport: {value}\n  tcp:\n"))
    assert loaded(tmp_path / "x.yaml", text).expect_transport == value
    assert loaded(tmp_path / "y.yaml", BARCELONA).expect_transport is None


def test_expect_transport_fast_is_refused(tmp_path: Path) -> None:
    text = edited(BARCELONA, ("  tcp:\n", "  expect_transport: fast\n  tcp:\n"))
    path = tmp_path / "x.yaml"
    found = problems(path, text)
    assert len(found) == 1 and found[0].startswith(f"{path}:{position(text, 'expect_transport')}: "
                                                   "network.expect_transport: expected rdma, sockets or any")
