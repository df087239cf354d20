"""Every shipped cluster file validates and renders valid manifests; golden checks on what matters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.render import Rendered, render
from mlenv.config import Cluster
from mlenv.core.clusters import load_cluster
from mlenv.plan import plan

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "clusters").glob("*.yaml"))
SEEDS = sorted((ROOT / "tests" / "fixtures" / "clusters").glob("original-*.yaml"))


def _modes(path: Path) -> list[str]:
    cluster = load_cluster(str(path))
    return ["rdma", "tcp"] if cluster.rdma.enabled else ["tcp"]


def _rendered(cluster: Cluster, mode: str, nodes: int | None = None, image: str | None = None) -> Rendered:
    """What ``mlenv render`` makes of ``cluster`` (validated against the Kubernetes schemas)."""
    return render(kube_deployment(plan(cluster, mode, nodes=nodes, image=image), cluster.backend == "openshift"))


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _statefulset(path: Path, mode: str) -> dict[str, Any]:
    return _by_kind(_rendered(load_cluster(str(path)), mode).objects, "StatefulSet")[0]


def _env(statefulset: dict[str, Any]) -> dict[str, str]:
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_shipped_clusters_exist() -> None:
    assert {p.stem for p in SHIPPED} >= {"barcelona", "nerc-production", "template", "local"}


@pytest.mark.parametrize("path", SHIPPED + SEEDS, ids=lambda p: p.name)
def test_every_cluster_file_renders_valid_manifests_in_each_allowed_mode(path: Path) -> None:
    for mode in _modes(path):
        rendered = _rendered(load_cluster(str(path)), mode)  # validates every object (strict)
        kinds = [o["kind"] for o in rendered.objects]
        assert kinds[0] == "ServiceAccount" and kinds[-1] == "StatefulSet"
        for obj in rendered.objects:
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "mlenv"
            assert labels["app"] == "ml-dev-env-multi"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_cluster_files_declare_their_schema_for_editors(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../tools/mlenv/config/cluster.schema.json"
    assert (path.parent / "../tools/mlenv/config/cluster.schema.json").resolve().is_file()


def test_seed_files_keep_the_original_names_and_quoted_numbers() -> None:
    cluster = load_cluster(str(ROOT / "tests/fixtures/clusters/original-barcelona.yaml"))
    assert cluster.rdma.gid_index == 3 and cluster.rdma.ib_timeout == 22
    assert cluster.rdma.devices == ("mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")
    deployment = kube_deployment(plan(cluster, "rdma"), openshift=True)
    assert deployment.app == "ml-dev-env" and deployment.headless_service == "ml-dev-env-headless"
    assert deployment.namespace == "nccl-test"
    nerc = load_cluster(str(ROOT / "tests/fixtures/clusters/original-nerc.yaml"))
    assert nerc.gpu_nodes == () and nerc.storage.mode == "rwx"


def test_barcelona_rdma_statefulset() -> None:
    sts = _statefulset(ROOT / "clusters/barcelona.yaml", "rdma")
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2 and spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "ml-dev-env-headless"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == list(
        load_cluster("barcelona").gpu_nodes)
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["resources"]["requests"]["memory"] == "128Gi"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # ipc_lock: false
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}  # half of the 256Gi limit
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["ml-dev-workspace", "ml-datasets"]
    assert "k8s.v1.cni.cncf.io/networks" not in pod.get("annotations", {})
    env = _env(sts)
    assert env == {
        "MLENV_CONTAINER_LOG": "/proc/1/fd/1", "MLENV_PREEMPTED_MARK": "/dev/shm/mlenv-pod-taken-away",
        "MLENV_CHECKPOINT_SIGNAL": "SIGTERM", "MLENV_RUN_SECRETS": "/mlenv-run",
        "MASTER_ADDR": "ml-dev-env-0.ml-dev-env-headless.nccl-test.svc.cluster.local",
        "MASTER_PORT": "29500", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "4",
        "MLENV_APP_NAME": "ml-dev-env", "MLENV_NETWORK_MODE": "rdma",
        "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "=mlx5_6,mlx5_7,mlx5_8,mlx5_9",
        "NCCL_SOCKET_IFNAME": "net1,net2,net3,net4", "NCCL_IB_GID_INDEX": "3", "NCCL_NET_GDR_LEVEL": "5",
        "NCCL_CROSS_NIC": "1", "NCCL_IB_TIMEOUT": "22", "NCCL_MIN_NCHANNELS": "4", "NCCL_P2P_LEVEL": "NVL",
    }


def test_tcp_mode_disables_ib_and_uses_the_exclude_list() -> None:
    env = _env(_statefulset(ROOT / "clusters/nerc-production.yaml", "tcp"))
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "^lo,docker0"
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_GID_INDEX" not in env


def test_rwx_mode_renders_shared_claims() -> None:
    objects = _rendered(load_cluster("nerc-production"), "tcp").objects
    claims = _by_kind(objects, "PersistentVolumeClaim")
    assert [c["metadata"]["name"] for c in claims] == ["ml-dev-workspace", "ml-datasets"]
    assert all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in claims)
    assert all(c["spec"]["storageClassName"] == "nfs-csi" for c in claims)
    sts = _by_kind(objects, "StatefulSet")[0]
    assert "volumeClaimTemplates" not in sts["spec"]
    service = _by_kind(objects, "Service")[0]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 29500


def test_template_networks_resources_ipc_lock_and_admin_scc() -> None:
    rendered = _rendered(load_cluster(str(ROOT / "clusters/template.yaml")), "rdma")
    sts = _by_kind(rendered.objects, "StatefulSet")[0]
    pod = sts["spec"]["template"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "sriov-rdma-net1,sriov-rdma-net2"
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["rdma/rdma"] == 1
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert _env(sts)["NCCL_IB_QPS_PER_CONNECTION"] == "4"
    scc, role, binding = rendered.admin_objects
    assert scc["kind"] == "SecurityContextConstraints"
    assert scc["allowedCapabilities"] == ["IPC_LOCK"] and scc["allowPrivilegedContainer"] is False
    assert role["rules"][0]["resourceNames"] == [scc["metadata"]["name"]]
    assert binding["subjects"][0]["name"] == "ml-dev-sa"
    tcp = _rendered(load_cluster(str(ROOT / "clusters/template.yaml")), "tcp")
    tcp_pod = _by_kind(tcp.objects, "StatefulSet")[0]["spec"]["template"]
    assert "k8s.v1.cni.cncf.io/networks" not in tcp_pod["metadata"]["annotations"]
    assert "rdma/rdma" not in tcp_pod["spec"]["containers"][0]["resources"]["limits"]


def test_gid_index_auto_leaves_detection_to_the_runtime(tmp_path: Path) -> None:
    text = (ROOT / "clusters/barcelona.yaml").read_text().replace('gid_index: "3"', "gid_index: auto")
    (tmp_path / "auto.yaml").write_text(text)
    assert "NCCL_IB_GID_INDEX" not in _env(_statefulset(tmp_path / "auto.yaml", "rdma"))


def test_overrides_nodes_and_image() -> None:
    sts = _by_kind(_rendered(load_cluster("barcelona"), "tcp", nodes=5, image="registry.example/ml:1").objects,
                   "StatefulSet")[0]
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/ml:1"
