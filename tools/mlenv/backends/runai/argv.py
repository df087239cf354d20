"""The ``runai`` command lines of a deployment, built from its plan: pure (no I/O), argv lists, never shell text.

Every flag is spelled as Run:ai's CLI reference spells it for the chosen generation (``cli: v1`` or ``v2``);
tests/fixtures/runai/REFERENCE.md gives the source of each, and tests/unit/test_runai_argv.py keeps the table of
every flag emitted. A few flags are spelled differently by different builds of one generation (``VARIANTS``): the
documented spelling is emitted unless the file picks another (``runai.flag_spellings``), and ``apply`` checks the
installed CLI's ``--help`` for it before submitting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlenv.backends.runai.settings import RunaiSettings
    from mlenv.plan import JobPlan

V1, V2 = "v1", "v2"
SUBMIT = {V1: ("submit-dist", "pytorch"), V2: ("training", "pytorch", "submit")}
WORKSPACE = "/workspace"
POD_COMMAND = ("sleep", "infinity")
"""What the pods run: the environment stays up, training starts through ``mlenv launch``."""
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
CONTAINER_LOG = {"MLENV_CONTAINER_LOG": "/proc/1/fd/1"}
"""Where the runtime copies a job's output, so that ``kubectl logs`` (and ``runai logs``) follow training."""
OPERATOR_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
"""Set on every pod by the training operator (its master Service and port): not sent with ``-e``."""

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


def flags(settings: RunaiSettings) -> dict[str, str]:
    """The spelling of every flag for the file's CLI generation and its ``flag_spellings``."""
    return {**FLAGS[settings.cli], **settings.flag_spellings}


def workspace_pvc(plan: JobPlan, claim: str) -> str:
    """The new-PVC value: ``claimname=C[,storageclass=SC],size=S,path=/workspace,accessmode-rwm|rwo``."""
    storage = plan.storage
    parts = [f"claimname={claim}", *([f"storageclass={storage.storage_class}"] if storage.storage_class else []),
             f"size={storage.workspace_size}", f"path={WORKSPACE}", "accessmode-rwm" if storage.shared
             else "accessmode-rwo"]
    return ",".join(parts)


def environment(plan: JobPlan) -> dict[str, str]:
    """What the pods get with ``-e``: the plan's env contract (but what the operator sets) and the container log."""
    return {**{k: v for k, v in plan.env.items() if k not in OPERATOR_VARIABLES}, **CONTAINER_LOG}


def submit(plan: JobPlan, settings: RunaiSettings, claim: str | None) -> list[str]:
    """The submit command of ``plan``: ``plan.nodes`` pods (a master and nodes-1 workers) running sleep infinity;
    ``claim``: the workspace PVC to create (or reuse) at /workspace."""
    f = flags(settings)
    name = NAME_FLAG[settings.cli]
    argv = ["runai", *SUBMIT[settings.cli], *([name, plan.app] if name else [plan.app])]
    argv += [f["project"], settings.project, f["workers"], str(plan.nodes - 1),
             f["gpus"], str(plan.gpus_per_node), f["image"], plan.image]
    for pool in settings.node_pools:
        argv += [f["node_pools"], pool]
    if settings.large_shm:
        argv.append(f["large_shm"])
    if plan.rdma_networks:
        argv += [f["annotation"], f"{MULTUS_ANNOTATION}={','.join(plan.rdma_networks)}"]
    for resource, count in plan.rdma_resources.items():
        argv += [f["extended_resource"], f"{resource}={count}"]
    if plan.ipc_lock:
        argv += [f["capability"], "IPC_LOCK"]
    if claim is not None:
        argv += [f["new_pvc"], workspace_pvc(plan, claim)]
    for pvc in settings.existing_pvcs:
        argv += [f["existing_pvc"], f"claimname={pvc.claim},path={pvc.path}"]
    for variable, value in environment(plan).items():
        argv += [f["environment"], f"{variable}={value}"]
    return [*argv, f["working_dir"], WORKSPACE, *settings.extra_args, f["command"], "--", *POD_COMMAND]


@dataclass(frozen=True)
class Variant:
    """A flag of the submit command that builds of one generation spell differently."""

    role: str
    spelling: str
    """The spelling sent (the documented one, or the file's runai.flag_spellings)."""
    known: tuple[str, ...]
    """Every spelling builds are known to use."""


@dataclass(frozen=True)
class Submission:
    """What ``apply`` sends (``argv``) and what it checks against the installed CLI's ``--help`` first."""

    cli: str
    argv: tuple[str, ...]
    variants: tuple[Variant, ...]


def submission(plan: JobPlan, settings: RunaiSettings, claim: str | None) -> Submission:
    """The submit command of ``plan`` with its flags whose spelling differs between builds."""
    argv = submit(plan, settings, claim)
    f = flags(settings)
    variants = tuple(Variant(role, f[role], known) for (cli, role), known in VARIANTS.items()
                     if cli == settings.cli and f[role] in argv)
    return Submission(settings.cli, tuple(argv), variants)


def submit_help(cli: str) -> list[str]:
    """``runai <submit command> --help``: the flags this build of the CLI knows."""
    return ["runai", *SUBMIT[cli], "--help"]


def delete(cli: str, name: str, project: str) -> list[str]:
    """v1 ``runai delete job NAME -p P``, v2 ``runai training pytorch delete NAME -p P``."""
    return ["runai", *(("delete", "job") if cli == V1 else ("training", "pytorch", "delete")), name, "-p", project]


def describe(cli: str, name: str, project: str) -> list[str]:
    """v1 ``runai describe job NAME -p P``, v2 ``runai training pytorch describe NAME -p P`` (exit 0: it exists)."""
    return ["runai", *(("describe", "job") if cli == V1 else ("training", "pytorch", "describe")), name, "-p",
            project]


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
