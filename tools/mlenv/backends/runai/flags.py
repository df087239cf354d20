"""Run:ai's CLI vocabulary: each generation's spelling of every flag mlenv emits, the flags ``runai.extra_args`` may
not pass, and the check of ``extra_args`` against them. Shared by the argv builders (``argv``) and the settings
parser (``settings``), which import nothing of each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

V1, V2 = "v1", "v2"
SUBMIT = {V1: ("submit-dist", "pytorch"), V2: ("training", "pytorch", "submit")}
WORKSPACE = "/workspace"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"

NAME_FLAG = {V1: "--name", V2: None}
"""How the workload is named: v1 ``--name NAME``, v2 the first argument."""
FLAGS: Mapping[str, Mapping[str, str]] = {
    V1: {"project": "-p", "workers": "--workers", "gpus": "-g", "image": "-i", "node_pools": "--node-pools",
         "large_shm": "--large-shm", "annotation": "--annotation", "extended_resource": "--extended-resource",
         "capability": "--add-capability", "new_pvc": "--pvc-new", "existing_pvc": "--pvc-exists",
         "environment": "-e", "working_dir": "--working-dir", "command": "--command"},
    V2: {"project": "-p", "workers": "--workers", "gpus": "--gpu-devices-request", "image": "-i",
         "node_pools": "--node-pools", "large_shm": "--large-shm", "annotation": "--annotation",
         "extended_resource": "--extended-resource", "capability": "--capability", "new_pvc": "--new-pvc",
         "existing_pvc": "--existing-pvc", "environment": "-e", "working_dir": "--working-dir",
         "command": "--command"},
}
"""Each generation's spelling of every other flag mlenv emits, by role."""
VARIANTS: Mapping[tuple[str, str], tuple[str, ...]] = {
    (V1, "existing_pvc"): ("--pvc-exists", "--pvc-exist", "--existing-pvc"),
    (V1, "node_pools"): ("--node-pools", "--node-pool"),
}
"""Flags that builds of one generation spell differently: the documented spelling first."""

_NAME = "the workload is named after app.name"
_NODES = "the node count is gpus.default_nodes or --nodes"
OWNED_FLAGS: Mapping[str, str] = {
    "--name": _NAME, "--job-name-prefix": _NAME, "--name-prefix": _NAME,
    "--workers": "N nodes (gpus.default_nodes or --nodes) make --workers N-1",
    "--no-master": "node 0 is the master pod",
    "--min-replicas": _NODES, "--max-replicas": _NODES,
    "-p": "from runai.project", "--project": "from runai.project",
    "-i": "from image, or --image", "--image": "from image, or --image",
    "-g": "from gpus.per_node", "--gpu": "from gpus.per_node", "--gpu-devices-request": "from gpus.per_node",
    "-e": "from env: (NCCL variables: nccl.env)", "--environment": "from env: (NCCL variables: nccl.env)",
    "--environment-variable": "from env: (NCCL variables: nccl.env)",
    "-c": "the pods run sleep infinity; training starts with mlenv launch",
    "--command": "the pods run sleep infinity; training starts with mlenv launch",
    "--attach": "mlenv deploy follows the pods; mlenv shell opens a shell",
    "--working-dir": f"the workspace is {WORKSPACE}",
    "--large-shm": "from runai.large_shm",
    "--node-pools": "from runai.node_pools", "--node-pool": "from runai.node_pools",
    "--extended-resource": "from network.rdma.resources",
    "--pvc-new": "from storage: (the workspace PVC)", "--new-pvc": "from storage: (the workspace PVC)",
    "--pvc-exists": "from runai.existing_pvcs", "--pvc-exist": "from runai.existing_pvcs",
    "--existing-pvc": "from runai.existing_pvcs",
}
"""Flags ``runai.extra_args`` may not pass: why (where in the cluster file they come from)."""
ANNOTATION_FLAGS = ("--annotation", "-a")


def extra_arg_problems(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, why) for every item of ``runai.extra_args`` that sets what mlenv sets (or cannot be passed)."""
    problems = []
    for index, arg in enumerate(args):
        if not arg.isprintable():
            problems.append((index, "expected printable text (no line breaks or control characters)"))
            continue
        if arg == "--":
            problems.append((index, "-- ends runai's flags: mlenv puts the pods' command (sleep infinity) after "
                                    "it; remove it"))
            continue
        if not arg.startswith("-") or arg == "-":
            continue
        name, has_value, value = arg.partition("=") if arg.startswith("--") else (arg[:2], bool(arg[2:]), arg[2:])
        if name in OWNED_FLAGS:
            problems.append((index, f"{name} is set by mlenv ({OWNED_FLAGS[name]}); remove it"))
        elif name in ANNOTATION_FLAGS:
            annotation = value if has_value else (args[index + 1] if index + 1 < len(args) else "")
            if annotation.lstrip("=").startswith(f"{MULTUS_ANNOTATION}="):
                problems.append((index, f"the {MULTUS_ANNOTATION} annotation is set by mlenv (from "
                                        "network.rdma.networks); remove it"))
    return problems
