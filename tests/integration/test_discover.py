"""``mlenv discover NAME`` against fakekube through the real kubectl: a commented cluster file that validates and
renders, TODOs where a person decides, never overwritten without --force; ``make discover NAME=``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests._prereq import require
from tests.fakekube import NodeSpec
from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.fakekube.seeds import network_attachment_definition, storage_class
from tests.helpers import invoke as mlenv

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "ml"


@pytest.fixture
def cluster(fake_kube_factory: Callable[..., FakeCluster],  # noqa: F811 - pytest fixture injection
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeCluster]:
    def start(**options: Any) -> FakeCluster:
        fake = fake_kube_factory(namespaces=[NAMESPACE], **options)
        fake.use_in(monkeypatch)
        return fake

    return start


def discovered(home: Path, name: str) -> tuple[str, dict[str, Any]]:
    """The file's text and what it says."""
    text = (home / "clusters" / f"{name}.yaml").read_text()
    return text, yaml.safe_load(text)


def validates_and_renders(name: str) -> list[dict[str, Any]]:
    validated = mlenv("validate", name)
    assert validated.exit_code == 0, validated.output
    rendered = mlenv("render", name)
    assert rendered.exit_code == 0, rendered.output
    return list(yaml.safe_load_all(rendered.stdout))


def test_openshift_with_rdma_and_rwx(cluster: Callable[..., FakeCluster], home: Path) -> None:
    rdma = {"rdma/rdma": "1"}
    fake = cluster(nodes=[NodeSpec("gpu-0", allocatable=rdma), NodeSpec("gpu-1", allocatable=rdma),
                          NodeSpec("gpu-2", gpus=4, ready=False), NodeSpec("cpu-0", gpus=0)])
    fake.server.add(network_attachment_definition(NAMESPACE, "roce", resource_name="rdma/rdma"))
    result = mlenv("discover", "mycluster")
    assert result.exit_code == 0, result.output
    assert "3 GPU nodes, 4 storage classes, 1 networks" in result.stderr
    text, found = discovered(home, "mycluster")
    assert found["backend"] == "openshift"
    assert found["cluster"] == {"name": "mycluster", "api": f"https://127.0.0.1:{fake.server.port}",
                                "namespace": NAMESPACE, "description": "3 GPU nodes (NVIDIA-H100-80GB-HBM3)"}
    assert found["storage"]["mode"] == "rwx" and found["storage"]["class_rwx"] == "nfs-csi"
    assert found["network"]["rdma"] == {"enabled": True, "gid_index": "auto", "gdr_level": "auto",
                                        "networks": ["roce"], "resources": {"rdma/rdma": 1}}
    assert found["gpus"] == {"per_node": 8, "type": "NVIDIA-H100-80GB-HBM3", "default_nodes": 2}
    assert found["security"]["ipc_lock"] is True and found["nodes"]["gpu_nodes"] == []
    assert "#   - gpu-2                    4 x NVIDIA-H100-80GB-HBM3, NOT READY" in text
    assert "cpu-0" not in text
    assert "# TODO: pin the pods to these nodes" in text and text.count("TODO") >= 8
    objects = validates_and_renders("mycluster")
    statefulset = objects[-1]
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["replicas"] == 2
    pod = statefulset["spec"]["template"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "roce"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["rdma/rdma"] == 1


def test_plain_kubernetes_without_rwx_or_rdma(cluster: Callable[..., FakeCluster], home: Path) -> None:
    cluster(openshift=False, nodes=[NodeSpec("gpu-0", gpus=4)],
            storage_classes=[storage_class("fast", "rbd.csi.ceph.com", default=True)])
    assert mlenv("discover", "plain").exit_code == 0
    text, found = discovered(home, "plain")
    assert found["backend"] == "kubernetes" and "no SCC API: plain Kubernetes" in text
    assert found["storage"]["mode"] == "volumeClaimTemplates" and found["storage"]["class_rwo"] == "fast"
    assert found["network"]["rdma"] == {"enabled": False}
    assert found["security"]["ipc_lock"] is False and found["gpus"]["per_node"] == 4
    validates_and_renders("plain")


def test_never_overwrites_without_force(cluster: Callable[..., FakeCluster], home: Path) -> None:
    cluster()
    existing = home / "clusters" / "mine.yaml"
    existing.write_text("# mine\n")
    refused = mlenv("discover", "mine")
    assert refused.exit_code == 2
    assert refused.stderr == f"error: {existing} exists: mlenv discover mine --force replaces it\n"
    assert existing.read_text() == "# mine\n"
    assert mlenv("discover", "mine", "--force").exit_code == 0
    assert discovered(home, "mine")[1]["cluster"]["name"] == "mine"


@pytest.mark.parametrize("args", [["Bad_Name"], ["ok", "--namespace", "Not-A-Label"]])
def test_bad_names_are_refused(args: list[str], home: Path) -> None:
    result = mlenv("discover", *args)
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert list((home / "clusters").iterdir()) == []


def test_make_discover(cluster: Callable[..., FakeCluster], home: Path) -> None:
    require("make")
    fake = cluster()
    def make(*variables: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["make", "-s", "discover", "NAME=viamake", *variables], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, check=False,
                              env={**os.environ, **fake.env, "MLENV_HOME": str(home), "MAKEFLAGS": ""})

    result = make()
    assert result.returncode == 0, result.stderr
    assert discovered(home, "viamake")[1]["cluster"]["namespace"] == NAMESPACE
    assert make().returncode == 2  # never overwritten without FORCE=1
    forced = make("FORCE=1")
    assert forced.returncode == 0, forced.stderr
