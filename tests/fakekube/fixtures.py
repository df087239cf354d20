"""Pytest helpers: a started FakeKube with a kubeconfig, and the real kubectl to drive it.

In a conftest.py::

    from tests.fakekube.fixtures import fake_kube, fake_kube_factory  # noqa: F401  (re-exported fixtures)

    def test_deploy(fake_kube):
        result = fake_kube.kubectl("get", "pods", "-o", "json")

or, outside pytest fixtures::

    with fake_cluster(tmp_path, nodes=["gpu-0", "gpu-1"], namespaces=["ml"]) as cluster:
        subprocess.run([...], env=cluster.env)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .server import DEFAULT_TOKEN, FakeKube

REPO_ROOT = Path(__file__).resolve().parents[2]


def find_kubectl() -> str | None:
    """The kubectl binary: on PATH, else ``<repo>/.venv/bin/kubectl``; None if neither exists."""
    found = shutil.which("kubectl")
    if found:
        return found
    local = REPO_ROOT / ".venv" / "bin" / "kubectl"
    return str(local) if local.exists() else None


def require_kubectl() -> str:
    """kubectl's path; without it the test is skipped, or fails when ``CI`` is set (CI must not skip)."""
    path = find_kubectl()
    if path is None:
        message = "kubectl not found on PATH or in .venv/bin (install it: https://kubernetes.io/docs/tasks/tools/)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass
class FakeCluster:
    """A running FakeKube plus what a client process needs to reach it.

    ``env`` is os.environ with KUBECONFIG, KUBECACHEDIR (discovery cache kept per test) and, when kubectl was
    found, OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH (so mlenv drives kubectl instead of oc).
    """

    server: FakeKube
    kubeconfig: Path
    namespace: str
    env: dict[str, str]
    kubectl_path: str | None

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl with this cluster's kubeconfig; never raises on a non-zero exit."""
        if self.kubectl_path is None:
            raise RuntimeError("kubectl not found; see fixtures.require_kubectl")
        return subprocess.run(
            [self.kubectl_path, *args], input=input, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )

    def use_in(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this process (the CLI run in-process, and the kubectl it runs) at this cluster, for one test."""
        for name in ("KUBECONFIG", "KUBECACHEDIR", "OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH"):
            monkeypatch.setenv(name, self.env[name])

    def forget_discovery(self) -> None:
        """Drop kubectl's discovery cache (KUBECACHEDIR), e.g. after changing ``server.hidden_groups``: kubectl
        otherwise keeps using the API groups it found first."""
        shutil.rmtree(self.env["KUBECACHEDIR"], ignore_errors=True)


@contextlib.contextmanager
def fake_cluster(
    tmp_path: Path,
    nodes: Iterable[str] = ("node-0", "node-1"),
    token: str = DEFAULT_TOKEN,
    namespaces: Iterable[str] = ("ml",),
    **server_options: Any,
) -> Iterator[FakeCluster]:
    """Start a FakeKube with these nodes and namespaces (the first one is the context's namespace), write its
    kubeconfig under ``tmp_path`` and yield a :class:`FakeCluster`. On exit the server stops; an exception
    inside the fake meanwhile (a bug of the fake) fails the test."""
    namespaces = list(namespaces)
    tmp_path.mkdir(parents=True, exist_ok=True)
    server = FakeKube(token=token, nodes=nodes, namespaces=["default", *namespaces], **server_options)
    with server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", (namespaces or ["default"])[0])
        kubectl = find_kubectl()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBECACHEDIR": str(tmp_path / "kube-cache")}
        if kubectl:
            env["OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH"] = kubectl
        yield FakeCluster(server, kubeconfig, (namespaces or ["default"])[0], env, kubectl)
    if server.failures:
        raise AssertionError(f"fakekube failed inside: {server.failures}")


@pytest.fixture
def fake_kube_factory(tmp_path: Path) -> Iterator[Callable[..., FakeCluster]]:
    """A factory ``make(**fake_cluster options) -> FakeCluster``; every cluster made is stopped after the test.
    Requires kubectl (skip, or fail under CI)."""
    require_kubectl()
    with contextlib.ExitStack() as stack:
        counter = iter(range(1_000_000))

        def make(**options: Any) -> FakeCluster:
            return stack.enter_context(fake_cluster(tmp_path / f"fakekube-{next(counter)}", **options))

        yield make


@pytest.fixture
def fake_kube(fake_kube_factory: Callable[..., FakeCluster]) -> FakeCluster:
    """A default fake cluster: nodes node-0 and node-1 (8 GPUs each), namespace ``ml`` as the context's."""
    return fake_kube_factory()
