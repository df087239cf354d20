"""No value from a cluster file can inject YAML: it is rejected, or it reaches the objects byte for byte."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.render import render
from mlenv.config.load import parse_yaml
from mlenv.core.clusters import validate
from mlenv.errors import ConfigError
from mlenv.plan import plan
from mlenv.render.yamlsafe import to_yaml

from tests.helpers import MLENV

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = yaml.safe_load((ROOT / "clusters/template.yaml").read_text())

# Every string field that is rendered into an object (mode rdma of the template renders them all).
STRING_FIELDS: list[tuple[Any, ...]] = [
    ("cluster", "name"), ("cluster", "namespace"), ("cluster", "description"), ("app", "name"), ("image",),
    ("nodes", "gpu_nodes", 0), ("storage", "class_rwx"), ("storage", "workspace_size"), ("storage", "shm_size"),
    ("network", "rdma", "devices"), ("network", "rdma", "interfaces"), ("network", "rdma", "networks", 0),
    ("network", "tcp", "p2p_level"), ("security", "service_account"), ("resources", "limits", "memory"),
    ("nccl", "env", "NCCL_IB_QPS_PER_CONNECTION"), ("scheduling", "tolerations", 0, "value"),
    ("scheduling", "tolerations", 0, "key"), ("scheduling", "nodeSelector", "nvidia.com/gpu.present"),
]

TRICKY = st.sampled_from([
    'a"\nkind: Secret', "x: y", "- a", "{a: b}", "'", '"', "\\", "\\n", "#c", "&a *a", "!!python/object", "---",
    "\u2028", "\x85", "\x7f", "é", "\U0001f600", " lead", "trail ", "null", "true", "0x1F", "1e3", "",
])


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _set(data: dict[str, Any], path: tuple[Any, ...], value: str) -> None:
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(field=st.sampled_from(STRING_FIELDS), value=st.one_of(st.text(), TRICKY))
def test_any_string_is_rejected_or_rendered_verbatim(field: tuple[Any, ...], value: str) -> None:
    data = copy.deepcopy(TEMPLATE)
    _set(data, field, value)
    text = yaml.safe_dump(data, allow_unicode=False)  # PyYAML's allow_unicode output mangles NEL
    try:
        deployment = plan(validate(parse_yaml(text, "h.yaml")), "rdma")
    except ConfigError:
        return
    rendered = render(kube_deployment(deployment, openshift=True))  # invalid: an injection or a rendering bug
    objects = [*rendered.objects, *rendered.admin_objects]
    assert any(value in s for s in _strings(objects)), f"{field}={value!r} did not reach the objects verbatim"
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects  # what `mlenv render` prints round-trips


def test_render_is_byte_identical_across_runs(tmp_path: Path) -> None:
    def once(home: Path) -> bytes:  # each run in a project of its own: a real render, never a cache replay
        shutil.copytree(ROOT / "clusters", home / "clusters")
        shutil.copytree(ROOT / "manifests", home / "manifests")
        return subprocess.run([str(MLENV), "render", "template", "--mode", "rdma"],
                              cwd=home, capture_output=True, check=True, env={**os.environ, "MLENV_HOME": str(home)}
                              ).stdout

    first, second = once(tmp_path / "a"), once(tmp_path / "b")
    assert first == second and first.startswith(b"---\napiVersion: v1\nkind: ServiceAccount")


def test_render_directory_writes_one_file_per_object_and_a_kustomization(tmp_path: Path) -> None:
    out = tmp_path / "out"
    subprocess.run([str(MLENV), "render", "clusters/template.yaml", "--mode",
                    "rdma", "-o", str(out)], cwd=ROOT, check=True, capture_output=True)
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["resources"] == sorted(p.name for p in out.glob("0*.yaml"))
    assert len(kustomization["resources"]) == 6  # with the NetworkPolicy (security.network_policy: true)
    admin = yaml.safe_load((out / "admin" / "kustomization.yaml").read_text())
    assert [name.split("-")[1] for name in admin["resources"]] == [
        "securitycontextconstraints", "role", "rolebinding"]
    for name in kustomization["resources"]:
        assert len(list(yaml.safe_load_all((out / name).read_text()))) == 1
