"""The ``runai:`` section of a cluster file (schema: ``mlenv/backends/runai.schema.json``), parsed for the Run:ai
backend. Imported at validate time for files with ``backend: runai``, so it imports nothing heavy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlenv.backends.kubeapi.rules import namespace_problem
from mlenv.backends.runai.flags import FLAGS, V1, V2, VARIANTS, WORKSPACE, extra_arg_problems
from mlenv.errors import show_value

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

DEFAULT_CLI = V2
NAMESPACE_PREFIX = "runai-"
"""A project P lives in namespace runai-P unless its admin chose another (REFERENCE.md, RUNAI-CLI)."""
MAX_NAMESPACE = 63


@dataclass(frozen=True)
class ExistingPvc:
    """A claim that exists already, mounted in every pod; mlenv never deletes it."""

    claim: str
    path: str


@dataclass(frozen=True)
class RunaiSettings:
    """How the Run:ai backend submits the workload."""

    project: str
    cli: str
    """``v1`` (``runai submit-dist pytorch``) or ``v2`` (``runai training pytorch submit``)."""
    namespace: str
    """The project's namespace: cluster.namespace, else runai-<project>."""
    node_pools: tuple[str, ...]
    large_shm: bool
    existing_pvcs: tuple[ExistingPvc, ...]
    extra_args: tuple[str, ...]
    flag_spellings: Mapping[str, str]
    """Flag role -> the spelling the installed build uses, where builds differ (flags.VARIANTS)."""
    workspace_volume: bool
    """The file has a ``storage:`` section: a new PVC is mounted at /workspace (and kept by clean)."""


def _project(reader: ClusterReader) -> str:
    project = reader.get("runai", "project")
    if project is None:
        reader.problem(("runai", "project"), "missing required field 'project' (your Run:ai project: runai project "
                                             "list, or runai list projects with the v1 CLI)")
        return "missing"
    return str(project)


def _namespace(reader: ClusterReader, project: str) -> str:
    namespace = reader.get("cluster", "namespace")
    if namespace is None:
        namespace = f"{NAMESPACE_PREFIX}{project}"
        if len(namespace) > MAX_NAMESPACE:
            reader.problem(("runai", "project"), f"its namespace {namespace} would be longer than {MAX_NAMESPACE} "
                                                 "characters; set cluster.namespace to the project's namespace")
    elif (reason := namespace_problem(namespace)) is not None:
        reader.problem(("cluster", "namespace"), reason)
    return str(namespace)


def _node_pools(reader: ClusterReader, cli: str) -> tuple[str, ...]:
    pools = tuple(reader.get("runai", "node_pools", default=[]))
    if cli == V1 and len(pools) > 1:
        reader.problem(("runai", "node_pools"), f"the v1 CLI documents --node-pools as one string, not a list: "
                                                f"give one pool (got {len(pools)}), or use cli: v2")
    return pools


def _existing_pvcs(reader: ClusterReader, workspace_volume: bool) -> tuple[ExistingPvc, ...]:
    claims = tuple(ExistingPvc(str(item["claim"]), str(item["path"]).rstrip("/") or "/")
                   for item in reader.get("runai", "existing_pvcs", default=[]))
    first: dict[str, int] = {}
    for index, pvc in enumerate(claims):
        if pvc.path in first:
            reader.problem(("runai", "existing_pvcs", index, "path"),
                           f"{pvc.path} is already the path of existing_pvcs[{first[pvc.path]}]; one claim per path")
        elif pvc.path == WORKSPACE and workspace_volume:
            reader.problem(("runai", "existing_pvcs", index, "path"),
                           f"{WORKSPACE} is where the workspace PVC of storage: is mounted; mount this claim "
                           "elsewhere, or remove storage: to use this claim as the workspace")
        first.setdefault(pvc.path, index)
    return claims


def _extra_args(reader: ClusterReader) -> tuple[str, ...]:
    args = tuple(str(arg) for arg in reader.get("runai", "extra_args", default=[]))
    for index, message in extra_arg_problems(args):
        reader.problem(("runai", "extra_args", index), message)
    return args


def _flag_spellings(reader: ClusterReader, cli: str) -> dict[str, str]:
    spellings = {str(k): str(v) for k, v in reader.get("runai", "flag_spellings", default={}).items()}
    for role, spelling in spellings.items():
        known = VARIANTS.get((cli, role))
        if known is None:
            reader.problem(("runai", "flag_spellings", role),
                           f"every {cli} build spells it {FLAGS[cli][role]}; remove this entry")
        elif spelling not in known:
            reader.problem(("runai", "flag_spellings", role),
                           f"expected one of {', '.join(known)} (how {cli} builds spell it), got "
                           f"{show_value(spelling)}")
    return spellings


def parse(reader: ClusterReader) -> RunaiSettings:
    """The Run:ai backend's settings (BackendInfo.settings of ``runai``)."""
    project = _project(reader)
    cli = str(reader.get("runai", "cli", default=DEFAULT_CLI))
    workspace_volume = reader.get("storage") is not None
    return RunaiSettings(
        project=project,
        cli=cli,
        namespace=_namespace(reader, project),
        node_pools=_node_pools(reader, cli),
        large_shm=bool(reader.get("runai", "large_shm", default=False)),
        existing_pvcs=_existing_pvcs(reader, workspace_volume),
        extra_args=_extra_args(reader),
        flag_spellings=_flag_spellings(reader, cli),
        workspace_volume=workspace_volume,
    )
