"""`mlenv status` of a 256-pod deployment on the fake API server, against `kubectl get pods -o json` there.

Counts the API calls status makes (aim: 1, one list of pods) and its wall time against the bare kubectl call,
which status makes itself (plus a local `config view`, a Python start and the table; --json
shows the cost without the table)."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.bench.timing import ROOT, command, row, wall_time
from tests.fakekube.fixtures import fake_cluster, find_kubectl
from tests.helpers import MLENV

PODS = 256
REPEAT = 7
NAMESPACE = "ml"


def _cluster_file(directory: Path, port: int) -> Path:
    path = directory / "bench256.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": {"name": "bench256", "api": f"127.0.0.1:{port}", "namespace": NAMESPACE},
        "backend": "kubernetes",
        "storage": {"mode": "rwx", "class_rwx": "nfs", "workspace_size": "1Gi", "datasets_size": "1Gi"},
        "gpus": {"per_node": 4, "default_nodes": PODS},
    }))
    return path


def _interleaved(actions: list[Callable[[], object]]) -> list[float]:
    """Median wall time of each action, runs taken in turns so that a busy machine slows all of them alike."""
    for action in actions:
        action()
    times: list[list[float]] = [[] for _ in actions]
    for _ in range(REPEAT):
        for measured, action in zip(times, actions, strict=True):
            measured.append(wall_time(action))
    return [statistics.median(measured) for measured in times]


def run() -> list[dict[str, object]]:
    """Deploy 256 pods on a fake cluster of 256 nodes, then time status and the bare kubectl list."""
    kubectl = find_kubectl()
    if kubectl is None:
        raise SystemExit("bench_status needs kubectl: make install-system")
    mlenv = str(MLENV)
    with tempfile.TemporaryDirectory() as tmp, \
            fake_cluster(Path(tmp), nodes=[f"gpu-{i}" for i in range(PODS)], namespaces=[NAMESPACE]) as cluster:
        home = Path(tmp) / "home"  # MLENV_HOME: the real manifests, the benchmark's own .mlenv/state.json
        home.mkdir()
        (home / "manifests").symlink_to(ROOT / "manifests")
        path = str(_cluster_file(home, cluster.server.port))
        env = {**cluster.env, "MLENV_HOME": str(home)}
        command([mlenv, "deploy", path, "--timeout", "600"], env)()
        status = command([mlenv, "status", "--cluster", path], env)
        status_json = command([mlenv, "status", "--cluster", path, "--json"], env)
        reference = command([kubectl, "get", "pods", "-n", NAMESPACE, "-o", "json"], env)
        cluster.server.requests.clear()
        status()
        calls = len(cluster.server.requests.api_calls())
        reference_time, status_time, status_json_time = _interleaved([reference, status, status_json])
    return [
        row(f"kubectl get pods -o json ({PODS} pods)", reference_time, reference_time, "kubectl get pods -o json"),
        row(f"mlenv status ({PODS} pods)", status_time, reference_time, "kubectl get pods -o json"),
        row(f"mlenv status --json ({PODS} pods)", status_json_time, reference_time, "kubectl get pods -o json"),
        {"name": f"mlenv status API calls ({PODS} pods)", "value": calls, "unit": "calls", "ratio": float(calls),
         "reference": "kubectl get pods -o json (1 call)"},
    ]
