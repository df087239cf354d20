"""Bad cluster files and arguments: one exact line per problem, exit code 2, no traceback, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests.unit.config.files import BARCELONA, ROOT, position

Run = Callable[..., CompletedProcess[str]]


# (id, replace-this, with-this, position-of, expected message after "file:line:col: ")
CASES = [
    ("bad-gid", 'gid_index: "3"', 'gid_index: "three"', "gid_index",
     'network.rdma.gid_index: expected an integer 0-255 or "auto", got "three"'),
    ("gid-range", 'gid_index: "3"', "gid_index: 300", "gid_index",
     'network.rdma.gid_index: expected an integer 0-255 or "auto", got 300'),
    ("typo", "  gpu_nodes:", "  gpu_node:", "gpu_node:",
     "nodes.gpu_node: unknown field; did you mean 'gpu_nodes'?"),
    ("top-typo", "gpus:\n", "gpu:\n", "gpu:", "gpu: unknown field; did you mean 'gpus'?"),
    ("namespace", "namespace: nccl-test", "namespace: NCCL_Test", "namespace",
     "cluster.namespace: expected a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters, "
     'starting and ending with a letter or digit), got "NCCL_Test"'),
    ("per-node-zero", "per_node: 4", 'per_node: "0"', "per_node",
     'gpus.per_node: expected an integer 1-64, got "0"'),
    ("quantity", "memory: 128Gi", "memory: 128GB", "memory: 128GB",
     'resources.requests.memory: expected a Kubernetes quantity such as 128Gi, 500Mi, 32 or 500m, got "128GB"'),
    ("requests-over-limits", "cpu: 32", "cpu: 96", "cpu: 96",
     "resources.requests.cpu: request 96 is larger than the limit 64; lower the request or raise "
     "resources.limits.cpu"),
    ("storage-class", "  class_rwo: ocs-external-storagecluster-ceph-rbd\n", "", "mode: volumeClaimTemplates",
     "storage.mode: storage mode volumeClaimTemplates needs storage.class_rwo; set it to a storage class "
     "from 'oc get storageclass'"),
    ("pinned", "default_nodes: 2", "default_nodes: 3", "default_nodes",
     "gpus.default_nodes: 3 nodes requested but only 2 are pinned in nodes.gpu_nodes; lower gpus.default_nodes "
     "or pin more nodes"),
    ("wrong-type", "enabled: true", "enabled: yes please", "enabled",
     'network.rdma.enabled: expected true or false, got "yes please"'),
    ("admission-kind", "nccl:\n", "scheduling:\n  admission: yunikorn\nnccl:\n", "admission: yunikorn",
     'scheduling.admission: expected none, kueue or volcano, got "yunikorn"'),
    ("queue-not-dns-label", "nccl:\n", "scheduling:\n  admission: kueue\n  queue: Team_A\nnccl:\n", "queue: Team_A",
     "scheduling.queue: expected a queue name: lower-case letters, digits and '-', at most 63 characters, "
     'got "Team_A"'),
    ("topology-two-levels", "nccl:\n",
     "scheduling:\n  admission: kueue\n  queue: q\n  topology: {required: a, preferred: b}\nnccl:\n", "topology:",
     "scheduling.topology: expected a mapping with one of required or preferred, naming a node label, got "
     '{"required": "a", "preferred": "b"}'),
    ("nccl-env-key", 'debug: "INFO"', 'debug: "INFO"\n  env:\n    nccl_bad: 1', "nccl_bad",
     "nccl.env.nccl_bad: expected an NCCL_* variable name in capitals, e.g. NCCL_IB_QPS_PER_CONNECTION, "
     'got key "nccl_bad"'),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_file_gives_one_exact_line_and_exit_2(case: tuple[str, str, str, str, str], tmp_path: Path,
                                                    run_mlenv: Run) -> None:
    _, old, new, anchor, message = case
    assert old in BARCELONA
    text = BARCELONA.replace(old, new, 1)
    path = tmp_path / "x.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    result = run_mlenv("render", str(path), "--mode", "tcp", "-o", str(out))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {path}:{position(text, anchor)}: {message}"]
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists()


def test_duplicate_keys_are_an_error(tmp_path: Path, run_mlenv: Run) -> None:
    text = BARCELONA.replace("  mode: volumeClaimTemplates\n", "  mode: volumeClaimTemplates\n  mode: rwx\n")
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    result = run_mlenv("validate", str(path))
    first = text.index("mode: volumeClaimTemplates")
    first_line = text.count("\n", 0, first) + 1
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {path}:{first_line + 1}:3: storage.mode: duplicate key (first set on line {first_line}); "
        f"keep only one, YAML would silently use the last")


def test_every_problem_is_reported_at_once(tmp_path: Path, run_mlenv: Run) -> None:
    text = BARCELONA.replace('gid_index: "3"', 'gid_index: "three"').replace("  gpu_nodes:", "  gpu_node:")
    path = tmp_path / "many.yaml"
    path.write_text(text)
    result = run_mlenv("validate", str(path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2
    assert "nodes.gpu_node: unknown field" in lines[0] and "network.rdma.gid_index" in lines[1]


def test_yaml_syntax_error_points_at_the_line(tmp_path: Path, run_mlenv: Run) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("cluster:\n  name: x\n  namespace: [unclosed\n")
    result = run_mlenv("validate", str(path))
    assert result.returncode == 2
    assert result.stderr == (f"error: {path}:3:14: invalid YAML: '[' opened here is never closed (parser stopped at "
                             f"line 4)\n")


def test_missing_required_field(tmp_path: Path, run_mlenv: Run) -> None:
    path = tmp_path / "short.yaml"
    path.write_text("cluster:\n  name: x\n")
    result = run_mlenv("validate", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: {path}:1:1: cluster: missing required field 'namespace'; "
                                     f"add it (see clusters/template.yaml)")


def test_rdma_mode_on_a_tcp_cluster_names_mode_tcp(run_mlenv: Run) -> None:
    result = run_mlenv("render", "nerc-production", "--mode", "rdma")
    assert result.returncode == 2 and result.stdout == ""
    text = (ROOT / "clusters/nerc-production.yaml").read_text()
    assert result.stderr.strip() == (
        f"error: clusters/nerc-production.yaml:{position(text, 'enabled: false')}: network.rdma.enabled: RDMA mode "
        f"requested but this cluster has rdma.enabled: false; use MODE=tcp (--mode tcp), or set "
        f"network.rdma.enabled: true if it has RDMA")


def test_more_nodes_than_pinned(run_mlenv: Run) -> None:
    result = run_mlenv("render", "barcelona", "--mode", "tcp", "--nodes", "6")
    assert result.returncode == 2
    assert "6 nodes requested but only 5 distinct nodes are pinned in nodes.gpu_nodes (one pod per node); use " \
           "--nodes 5 or fewer" in result.stderr


def test_unknown_cluster_suggests_a_name(run_mlenv: Run) -> None:
    result = run_mlenv("validate", "barcelon")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unknown cluster 'barcelon': did you mean 'barcelona'?")


def test_image_with_whitespace_is_rejected(run_mlenv: Run) -> None:
    result = run_mlenv("render", "barcelona", "--image", "evil\n- x")
    assert result.returncode == 2
    assert "--image" in result.stderr and "Traceback" not in result.stderr


def test_rdma_without_networks_warns_about_socket_fallback(run_mlenv: Run) -> None:
    result = run_mlenv("render", "barcelona", "--mode", "rdma")
    assert result.returncode == 0
    assert "WARNING: RDMA mode without network.rdma.networks or network.rdma.resources: pods will get no RDMA " \
           "device and NCCL will fall back to sockets" in result.stderr
