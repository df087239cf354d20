"""The ``runai`` command lines of a deployment, built from its plan: pure (no I/O), argv lists, never shell text.

Every flag is spelled as Run:ai's CLI reference spells it for the chosen generation (``cli: v1`` or ``v2``);
tests/fixtures/runai/REFERENCE.md gives the source of each, and tests/unit/test_runai_argv.py keeps the table of
every flag emitted. A few flags are spelled differently by different builds of one generation (``VARIANTS``): the
documented spelling is emitted unless the file picks another (``runai.flag_spellings``), and ``apply`` checks the
installed CLI's ``--help`` for it before submitting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlenv.backends.runai.flags import FLAGS, MULTUS_ANNOTATION, NAME_FLAG, SUBMIT, V1, VARIANTS, WORKSPACE

if TYPE_CHECKING:
    from mlenv.backends.runai.settings import RunaiSettings
    from mlenv.plan import JobPlan

POD_COMMAND = ("sleep", "infinity")
"""What the pods run: the environment stays up, training starts through ``mlenv launch``."""
CONTAINER_LOG = {"MLENV_CONTAINER_LOG": "/proc/1/fd/1"}
"""Where the runtime copies a job's output, so that ``kubectl logs`` (and ``runai logs``) follow training."""
OPERATOR_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
"""Set on every pod by the training operator (its master Service and port): not sent with ``-e``."""


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
