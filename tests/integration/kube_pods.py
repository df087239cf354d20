"""A Kubernetes, OpenShift or Run:ai deployment whose pods really run: fakekube started from its command line with
``--run-pods``, the real kubectl (and the Run:ai stand-in), and the real ``mlenv`` in subprocesses.

:func:`kube_project` yields a :class:`KubeProject`: a project directory (MLENV_HOME) with ``clusters/<name>.yaml``
for the fake, and ``env`` (KUBECONFIG, KUBECACHEDIR, MLENV_HOME) for anything that should reach it. Everything the
pods ran is gone when the fixture ends (the fake's SIGTERM stops every pod), which :func:`pod_processes` checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._prereq import require
from tests.fakekube.fixtures import require_kubectl
from tests.helpers import ROOT, free_port, run_mlenv, succeeded

NAMESPACE = "ml"
APP = "ml-dev-env"
START_SECONDS = 60.0


@dataclass(frozen=True)
class KubeProject:
    """A project deployed (or to deploy) to a fakekube whose pods run on this machine."""

    home: Path
    cluster_file: Path
    env: dict[str, str]
    pods_root: Path
    """Where the fake keeps its pods (their roots, volumes and logs)."""

    def mlenv(self, *args: str, timeout: float = 180, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real `mlenv` against this project."""
        return run_mlenv(*args, env=self.env, input=input, timeout=timeout)

    def ok(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run `mlenv` and insist that it succeeded."""
        return succeeded(self.mlenv(*args, timeout=timeout))

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The real kubectl against the fake."""
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              check=False)


RUNAI_PROJECT = "ml"
RUNAI_STANDIN = ROOT / "tests" / "fixtures" / "runai"
NAMESPACES = {"kubernetes": NAMESPACE, "openshift": NAMESPACE, "runai": f"runai-{RUNAI_PROJECT}"}
KUBERNETES_SECTION = f"""\
cluster:
  name: fake
  api: 127.0.0.1:{{port}}
  namespace: {NAMESPACE}
storage:
  mode: volumeClaimTemplates
  class_rwo: nfs-csi
  workspace_size: 1Gi
  datasets_size: 1Gi
"""
BACKEND_SECTIONS = {
    "kubernetes": KUBERNETES_SECTION,
    "openshift": KUBERNETES_SECTION,
    "runai": f"""\
cluster:
  name: fake
runai:
  project: {RUNAI_PROJECT}
  cli: v2
  large_shm: true
storage:
  mode: rwx
  class_rwx: nfs-csi
  workspace_size: 1Gi
""",
}


def cluster_document(backend: str, port: int) -> str:
    """A 2-node cluster file of ``backend`` for the fake at ``port``: two processes per node (a 2x2 world; torch
    on CPU, gloo)."""
    return f"""\
backend: {backend}
{BACKEND_SECTIONS[backend].format(port=port)}image: python:3.12-slim
gpus:
  per_node: 2
  default_nodes: 2
  procs_per_node: 2
network:
  tcp:
    interface_exclude: "^lo"
"""


def pod_processes(pods_root: Path) -> list[int]:
    """Processes whose root directory is one of the fake's pods (anything a pod ran)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            root = os.readlink(entry / "root")
        except OSError:
            continue
        if root.startswith(f"{pods_root}/"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def kube_project(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[KubeProject]:
    """fakekube (``python -m tests.fakekube --run-pods``) serving a project's 2-node cluster file of the backend
    the test's parameter names (``indirect``; default ``kubernetes``): see :func:`kube_cluster`."""
    with kube_cluster(tmp_path, getattr(request, "param", "kubernetes")) as project:
        yield project


@contextmanager
def kube_cluster(tmp_path: Path, backend: str, security: str = "") -> Iterator[KubeProject]:
    """fakekube (``python -m tests.fakekube --run-pods``) serving a project's 2-node cluster file of ``backend``
    (``runai`` adds the Run:ai stand-in on PATH and labels the project's namespace as Run:ai does; ``kubernetes`` is
    plain Kubernetes, the others OpenShift, whose SCC runs pods as a UID of the namespace's range) with
    ``security`` (the cluster file's section, YAML); every pod's processes are gone when it ends."""
    require_kubectl()
    require("rsync", "torch")
    home = tmp_path / "home"
    (home / "clusters").mkdir(parents=True)
    (home / "manifests").symlink_to(ROOT / "manifests")
    pods_root = tmp_path / "pods"
    pods_root.mkdir()
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    namespace = NAMESPACES[backend]
    plain = ["--no-openshift"] if backend == "kubernetes" else []
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fakekube", "--port", str(port), "--namespace", namespace, "--run-pods",
         "--restart-backoff", "30", "--kubeconfig", str(kubeconfig), *plain],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(pods_root)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    assert server.stdout is not None
    first = server.stdout.readline()
    assert first.startswith("fakekube serving"), first + server.stdout.read()
    cluster_file = home / "clusters" / "fake.yaml"
    cluster_file.write_text(cluster_document(backend, port) + security)
    env = {**os.environ, "MLENV_HOME": str(home), "KUBECONFIG": str(kubeconfig),
           "KUBECACHEDIR": str(tmp_path / "kube-cache")}
    if backend == "runai":
        env.update(PATH=f"{RUNAI_STANDIN}{os.pathsep}{env['PATH']}", RUNAI_STANDIN_CLI="v2",
                   RUNAI_STANDIN_LOG=str(tmp_path / "runai-argv.jsonl"))
    project = KubeProject(home, cluster_file, env, pods_root)
    try:
        if backend == "runai":
            labelled = project.kubectl("label", "namespace", namespace, f"runai/queue={RUNAI_PROJECT}")
            assert labelled.returncode == 0, labelled.stderr
        yield project
    finally:
        server.terminate()
        output = server.communicate(timeout=START_SECONDS)[0]
        deadline = time.monotonic() + START_SECONDS
        while pod_processes(pods_root) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.returncode == 0, output
        assert not pod_processes(pods_root), "pod processes outlived fakekube"
