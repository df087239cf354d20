"""Files that pass the schema but that Kubernetes or mlenv cannot use: each row is an exact edit of a valid file
and the exact lines it must give (bad input, exit 2), at the line and column of the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_validate.utils import all_versions

from tests.unit.config.files import BARCELONA, edited, loaded, position, problems

RDMA = 'min_nchannels: "4"\n'
TOLERATIONS = "nccl:\n"
VERSIONS = sorted({int(version.split(".")[1]) for version in all_versions()})
RANGE = f"mlenv checks manifests against 1.{VERSIONS[0]} to 1.{VERSIONS[-1]}"


def _resource(name: str) -> tuple[str, str]:
    return RDMA, f"{RDMA}    resources:\n      {name}: 1\n"


def _toleration(body: str) -> tuple[str, str]:
    return TOLERATIONS, f"scheduling:\n  tolerations:\n    - {body}\n{TOLERATIONS}"


def _scheduling(*fields: str) -> tuple[str, str]:
    return TOLERATIONS, "scheduling:\n" + "".join(f"  {field}\n" for field in fields) + TOLERATIONS


# (id, replacements in the seed file, [(where the problem points, expected text after "file:line:col: ")])
ROWS: list[tuple[str, list[tuple[str, str]], list[tuple[str, str]]]] = [
    ("rdma-resource-gpu", [_resource("nvidia.com/gpu")], [
        ("nvidia.com/gpu:", "network.rdma.resources.nvidia.com/gpu: would override the GPU count of gpus.per_node; "
                            "remove it and set gpus.per_node")]),
    ("rdma-resource-cpu", [_resource("cpu")], [
        ("cpu: 1", "network.rdma.resources.cpu: would override resources.limits.cpu; remove it and set "
                   "resources.requests/limits.cpu")]),
    ("rdma-resource-memory", [_resource("memory")], [
        ("memory: 1", "network.rdma.resources.memory: would override resources.limits.memory; remove it and set "
                      "resources.requests/limits.memory")]),
    ("rdma-resource-ephemeral-storage", [_resource("ephemeral-storage")], [
        ("ephemeral-storage:", "network.rdma.resources.ephemeral-storage: is a node resource, not an RDMA device; "
                               "remove it")]),
    ("rdma-resource-hugepages", [_resource("hugepages-2Mi")], [
        ("hugepages-2Mi:", "network.rdma.resources.hugepages-2Mi: is a node resource, not an RDMA device; "
                           "remove it")]),
    ("duplicate-gpu-node", [("  # - moc-r4pcc04u17", "    - moc-r4pcc04u25-nairr")], [
        ("moc-r4pcc04u25-nairr\n\n", "nodes.gpu_nodes[2]: moc-r4pcc04u25-nairr is listed twice (first as "
                                       "gpu_nodes[0]); one pod runs per node, so list each node once")]),
    ("more-nodes-than-distinct-pinned", [("moc-r4pcc04u23-nairr", "moc-r4pcc04u25-nairr")], [
        ("moc-r4pcc04u25-nairr\n  #", "nodes.gpu_nodes[1]: moc-r4pcc04u25-nairr is listed twice (first as "
                                        "gpu_nodes[0]); one pod runs per node, so list each node once"),
        ("default_nodes", "gpus.default_nodes: 2 nodes requested but only 1 are pinned in nodes.gpu_nodes; lower "
                          "gpus.default_nodes or pin more nodes")]),
    ("toleration-exists-with-value", [_toleration("{key: dedicated, operator: Exists, value: gpu}")], [
        ("value: gpu}", "scheduling.tolerations[0].value: operator: Exists tolerates any value, so value must "
                            "be empty; remove value or use operator: Equal")]),
    ("toleration-key-not-qualified", [_toleration('{key: "gpu node", operator: Exists}')], [
        ("key:", 'scheduling.tolerations[0].key: expected a label key like dedicated or example.com/gpu (an '
                       "optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_' or '.'), got "
                       '"gpu node"')]),
    ("toleration-key-prefix-not-dns", [_toleration("{key: Example.com/gpu, operator: Exists}")], [
        ("key:", "scheduling.tolerations[0].key: expected a label key like dedicated or example.com/gpu "
                            "(an optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_' or '.'), "
                            'got "Example.com/gpu"')]),
    ("toleration-empty-key-equal", [_toleration("{operator: Equal, value: gpu}")], [
        ("operator: Equal", "scheduling.tolerations[0].operator: a toleration without a key must have operator: "
                         "Exists (it then tolerates every taint); add a key or set operator: Exists")]),
    ("toleration-value-not-label", [_toleration('{key: dedicated, value: "gpu pool"}')], [
        ("value:", "scheduling.tolerations[0].value: expected a label value (at most 63 letters, digits, "
                       "'-', '_' or '.', starting and ending with a letter or digit), got \"gpu pool\"")]),
    ("toleration-seconds-float", [_toleration("{key: k, effect: NoExecute, tolerationSeconds: 1.0e+3}")], [
        ("tolerationSeconds", "scheduling.tolerations[0].tolerationSeconds: expected a whole number of seconds "
                              "written as an integer, got 1000.0")]),
    ("toleration-seconds-huge-float", [_toleration("{key: k, effect: NoExecute, tolerationSeconds: 1.0e+30}")], [
        ("tolerationSeconds", "scheduling.tolerations[0].tolerationSeconds: expected a whole number of seconds "
                              "written as an integer, got 1e+30")]),
    ("toleration-seconds-beyond-int64",
     [_toleration("{key: k, effect: NoExecute, tolerationSeconds: 9223372036854775808}")], [
        ("tolerationSeconds", "scheduling.tolerations[0].tolerationSeconds: expected a number of seconds from "
                                "-2^63 to 2^63-1, got 9223372036854775808")]),
    ("toleration-seconds-without-noexecute",
     [_toleration("{key: k, effect: NoSchedule, tolerationSeconds: 60}")], [
        ("effect: NoSchedule", "scheduling.tolerations[0].effect: tolerationSeconds applies only to effect: NoExecute; "
                       "set effect: NoExecute or remove tolerationSeconds")]),
    ("kueue-without-queue", [_scheduling("admission: kueue")], [
        ("admission: kueue", "scheduling.admission: kueue needs scheduling.queue: the LocalQueue in nccl-test that "
                             "admits the job (kubectl get localqueues -n nccl-test lists them; a cluster admin "
                             "creates one)")]),
    ("queue-without-admission", [_scheduling("queue: team-a")], [
        ("queue: team-a", "scheduling.queue: is used only with scheduling.admission: kueue or volcano; set "
                          "admission or remove queue")]),
    ("topology-without-kueue",
     [_scheduling("admission: volcano", "topology: {required: topology.kubernetes.io/zone}")], [
        ("topology:", "scheduling.topology: topology-aware placement is Kueue's: set scheduling.admission: kueue "
                      "(with scheduling.queue) or remove scheduling.topology")]),
    ("kubernetes-version-too-old", [("cluster:\n", 'kubernetes_version: "1.20"\ncluster:\n')], [
        ("kubernetes_version", f"kubernetes_version: Kubernetes 1.20 is not supported: {RANGE}; pick the one "
                               f"closest to your cluster's version")]),
    ("kubernetes-version-too-new", [("cluster:\n", 'kubernetes_version: "v1.999"\ncluster:\n')], [
        ("kubernetes_version", f"kubernetes_version: Kubernetes 1.999 is not supported: {RANGE}; pick the one "
                               f"closest to your cluster's version")]),
    ("workspace-size-zero", [("workspace_size: 100Gi", "workspace_size: 0")], [
        ("workspace_size", "storage.workspace_size: expected a quantity larger than 0, got 0")]),
    ("datasets-size-zero", [("datasets_size: 500Gi", 'datasets_size: "0Gi"')], [
        ("datasets_size", 'storage.datasets_size: expected a quantity larger than 0, got "0Gi"')]),
    ("shm-size-zero", [("  mode: volumeClaimTemplates", "  mode: volumeClaimTemplates\n  shm_size: 0.0")], [
        ("shm_size", "storage.shm_size: expected a quantity larger than 0, got 0.0")]),
    ("memory-limit-leaves-no-shm", [("memory: 128Gi", "memory: 1"), ("memory: 256Gi", 'memory: "1"')], [
        ('memory: "1"', 'resources.limits.memory: 1 is too small: /dev/shm gets half the memory limit, which would '
                        'be 0 bytes; raise resources.limits.memory or set storage.shm_size')]),
    ("negative-request", [("memory: 128Gi", 'memory: "-128Gi"')], [
        ("memory: \"-", 'resources.requests.memory: expected a quantity of 0 or more, got "-128Gi"')]),
    ("namespace-kube-system", [("namespace: nccl-test", "namespace: kube-system")], [
        ("namespace:", "cluster.namespace: kube-system is a system namespace; deploy into a namespace of your own "
                       "(oc new-project NAME, or kubectl create namespace NAME)")]),
    ("namespace-openshift", [("namespace: nccl-test", "namespace: openshift")], [
        ("namespace:", "cluster.namespace: openshift is a system namespace; deploy into a namespace of your own "
                       "(oc new-project NAME, or kubectl create namespace NAME)")]),
    ("namespace-openshift-star", [("namespace: nccl-test", "namespace: openshift-monitoring")], [
        ("namespace:", "cluster.namespace: openshift-monitoring is a system namespace; deploy into a namespace of "
                       "your own (oc new-project NAME, or kubectl create namespace NAME)")]),
    ("namespace-kube-node-lease", [("namespace: nccl-test", "namespace: kube-node-lease")], [
        ("namespace:", "cluster.namespace: kube-node-lease is a system namespace; deploy into a namespace of your "
                       "own (oc new-project NAME, or kubectl create namespace NAME)")]),
]


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_schema_valid_but_unusable_file_is_bad_input(row: tuple[str, list[tuple[str, str]], list[tuple[str, str]]],
                                                       tmp_path: Path) -> None:
    _, replacements, expected = row
    text = edited(BARCELONA, *replacements)
    path = tmp_path / "x.yaml"
    assert problems(path, text) == [f"{path}:{position(text, anchor)}: {message}" for anchor, message in expected]


def test_default_namespace_is_a_warning(tmp_path: Path) -> None:
    cluster = loaded(tmp_path / "x.yaml", edited(BARCELONA, ("namespace: nccl-test", "namespace: default")))
    assert cluster.info.namespace == "default"
    assert ("cluster.namespace: default is shared by everything in the cluster; a namespace of your own keeps "
            "mlenv's objects, and what clean deletes, apart") in cluster.warnings


def test_valid_tolerations_pass_as_written(tmp_path: Path) -> None:
    text = edited(BARCELONA, _toleration("{operator: Exists}\n    - {key: example.com/gpu, operator: Exists, "
                                         "effect: NoExecute, tolerationSeconds: -5}"))
    cluster = loaded(tmp_path / "x.yaml", text)
    assert cluster.scheduling.tolerations == (
        {"operator": "Exists"},
        {"key": "example.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -5})


@pytest.mark.parametrize(("written", "seconds"), [("45", 45), ("'90s'", 90), ("5m", 300), ("1h", 3600), ("0", 0)])
def test_grace_period_in_seconds_or_a_duration(tmp_path: Path, written: str, seconds: int) -> None:
    text = edited(BARCELONA, (TOLERATIONS, f"scheduling:\n  grace_period: {written}\n{TOLERATIONS}"))
    assert loaded(tmp_path / "x.yaml", text).scheduling.grace_period == seconds


def test_grace_period_defaults_to_kubernetes_30s(tmp_path: Path) -> None:
    assert loaded(tmp_path / "x.yaml", BARCELONA).scheduling.grace_period == 30


@pytest.mark.parametrize("written", ["5 minutes", "-1", "1.5m", "5d"])
def test_grace_period_refused_in_one_line(tmp_path: Path, written: str) -> None:
    text = edited(BARCELONA, (TOLERATIONS, f"scheduling:\n  grace_period: {written}\n{TOLERATIONS}"))
    found = problems(tmp_path / "x.yaml", text)
    assert len(found) == 1 and "scheduling.grace_period" in found[0], found
    assert "seconds (30) or a duration like 90s, 5m or 1h" in found[0], found
