"""The ``mlenv`` command line: parses arguments and prints; the work happens in the modules it imports lazily."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from mlenv.config.model import Cluster
    from mlenv.plan import Deployment

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(func: F) -> F:
    """Turn mlenv errors into one-line messages and exit codes (2 bad input, 1 failed); never a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from mlenv.errors import MlenvError
        from mlenv.ui import error

        try:
            return func(*args, **kwargs)
        except MlenvError as exc:
            error(str(exc))
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            error("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


mode_option = click.option("--mode", type=click.Choice(["rdma", "tcp"]), default=None,
                           help="Network mode (default: rdma when the cluster has RDMA enabled, else tcp).")
nodes_option = click.option("--nodes", type=click.IntRange(min=1), default=None,
                            help="Number of nodes (pods); default gpus.default_nodes.")
image_option = click.option("--image", default=None, help="Container image (overrides the cluster file).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _deployment(cluster_ref: str, mode: str | None, nodes: int | None, image: str | None) -> Deployment:
    from mlenv.config import load_cluster
    from mlenv.plan import plan
    from mlenv.ui import warn

    deployment = plan(load_cluster(cluster_ref), mode=mode, nodes=nodes, image=image)
    for message in deployment.warnings:
        warn(message)
    return deployment


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mlenv")
def main() -> None:
    """mlenv: one YAML file per GPU cluster -> a working multi-node training environment.

    Clusters are named (clusters/NAME.yaml) or given as a path.
    """


@main.command("list")
@json_option
@reports_errors
def list_clusters(as_json: bool) -> None:
    """List the clusters in clusters/: backend, nodes x GPUs, RDMA, storage mode."""
    from mlenv.config import load_cluster
    from mlenv.config.discover import cluster_names
    from mlenv.errors import MlenvError
    from mlenv.ui import print_json, table

    rows: list[dict[str, Any]] = []
    for name in cluster_names():
        try:
            cluster = load_cluster(name)
        except MlenvError as exc:
            first = str(exc).splitlines()[0]
            rows.append({"name": name, "valid": False, "error": first})
            continue
        rows.append(_summary(cluster))
    if as_json:
        print_json(rows)
        return
    table(None, ["NAME", "BACKEND", "NODES x GPUS", "RDMA", "STORAGE", "DESCRIPTION"], [
        [r["name"], r.get("backend", "-"),
         f"{r['nodes']} x {r['gpus_per_node']}" if r["valid"] else "-",
         ("on" if r["rdma"] else "off") if r["valid"] else "-",
         r.get("storage_mode", "-"),
         r.get("description") or "" if r["valid"] else f"INVALID: {r['error']} (mlenv validate {r['name']})"]
        for r in rows])


def _summary(cluster: Cluster) -> dict[str, Any]:
    return {
        "name": cluster.info.name, "valid": True, "file": cluster.source, "backend": cluster.backend,
        "namespace": cluster.info.namespace, "nodes": cluster.gpus.default_nodes,
        "gpus_per_node": cluster.gpus.per_node, "rdma": cluster.rdma.enabled,
        "storage_mode": cluster.storage.mode, "description": cluster.info.description,
    }


@main.command()
@click.argument("cluster")
@mode_option
@nodes_option
@json_option
@reports_errors
def validate(cluster: str, mode: str | None, nodes: int | None, as_json: bool) -> None:
    """Check a cluster file (schema and semantics); print OK or every problem."""
    deployment = _deployment(cluster, mode, nodes, None)
    summary = {**_summary(deployment.cluster), "mode": deployment.mode, "nodes": deployment.nodes,
               "warnings": list(deployment.warnings)}
    if as_json:
        from mlenv.ui import print_json

        print_json(summary)
        return
    click.echo(f"OK {deployment.cluster.source}: {deployment.cluster.info.name} ({deployment.cluster.backend}, "
               f"{deployment.nodes} x {deployment.cluster.gpus.per_node} GPUs, {deployment.mode}, "
               f"storage {deployment.storage.mode})")


@main.command()
@click.argument("cluster")
@mode_option
@nodes_option
@image_option
@click.option("-o", "--output", "output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one file per object plus kustomization.yaml into this directory.")
@click.option("--admin", is_flag=True, help="Print only the objects a cluster admin must apply (IPC_LOCK SCC + RBAC).")
@reports_errors
def render(cluster: str, mode: str | None, nodes: int | None, image: str | None, output: Path | None,
           admin: bool) -> None:
    """Render the manifests of a cluster (validated against the Kubernetes schemas)."""
    from mlenv.backends.kubernetes.render import render as render_kubernetes
    from mlenv.backends.kubernetes.render import to_yaml

    rendered = render_kubernetes(_deployment(cluster, mode, nodes, image))
    if output is not None:
        from mlenv.render.output import write_directory
        from mlenv.ui import info

        written = write_directory(output, rendered)
        info(f"wrote {len(written)} files to {output}")
        return
    objects = rendered.admin_objects if admin else rendered.objects
    if admin and not objects:
        from mlenv.ui import info

        info("nothing for an admin to apply: security.ipc_lock is false or the backend is not openshift")
    click.echo(to_yaml(objects), nl=False)


@main.command()
@click.argument("cluster", required=False)
@mode_option
@nodes_option
@image_option
@click.option("--dry-run", is_flag=True, help="Print the exact manifests deploy would apply, change nothing.")
@click.option("--timeout", type=click.IntRange(min=1), default=900, show_default=True,
              help="Seconds to wait for every pod to be Ready.")
@reports_errors
def deploy(cluster: str | None, mode: str | None, nodes: int | None, image: str | None, dry_run: bool,
           timeout: int) -> None:
    """Deploy a cluster's environment and wait until every pod is Ready (re-running converges).

    Without CLUSTER, re-deploys the recorded deployment.
    """
    if cluster is None:
        from mlenv import state

        recorded = state.load()
        cluster, mode, nodes = recorded.cluster_file, mode or recorded.mode, nodes or recorded.nodes
        image = image or recorded.image
    deployment = _deployment(cluster, mode, nodes, image)
    if dry_run:
        from mlenv.backends import dry_run_text

        click.echo(dry_run_text(deployment), nl=False)
        return
    from mlenv import state
    from mlenv.backends import backend_for

    backend_for(deployment.cluster).deploy(deployment, timeout=timeout,
                                           on_applied=lambda: state.record(deployment, image))


cluster_option = click.option("--cluster", "cluster_ref", default=None, metavar="NAME|PATH",
                              help="Cluster to act on (default: the last one deployed, from .mlenv/state.json).")
pod_option = click.option("--pod", type=click.IntRange(min=0), default=None, metavar="N",
                          help="Pod ordinal (default: all pods, or pod 0 for shell).")


def _active(cluster_ref: str | None) -> Deployment:
    """The deployment a command acts on: --cluster wins over the recorded one."""
    from mlenv import state
    from mlenv.config import load_cluster
    from mlenv.errors import UsageError
    from mlenv.plan import plan

    if cluster_ref is None:
        active = state.load()
        return plan(load_cluster(active.cluster_file), mode=active.mode, nodes=active.nodes, image=active.image)
    cluster = load_cluster(cluster_ref)
    try:
        active = state.load()
    except UsageError:  # nothing recorded: the file's defaults
        return plan(cluster)
    if active.cluster_file == str(Path(cluster.source).resolve()):
        return plan(cluster, mode=active.mode, nodes=active.nodes, image=active.image)
    return plan(cluster)


@main.command()
@cluster_option
@json_option
@reports_errors
def status(cluster_ref: str | None, as_json: bool) -> None:
    """One table: pod, node, phase, ready, restarts, GPUs, IP, RDMA devices."""
    from dataclasses import asdict

    from mlenv.backends import backend_for
    from mlenv.ui import print_json, table

    deployment = _active(cluster_ref)
    rows = backend_for(deployment.cluster).status(deployment)
    if as_json:
        print_json({"cluster": deployment.cluster.info.name, "namespace": deployment.namespace,
                    "mode": deployment.mode, "pods": [asdict(row) for row in rows]})
        return
    if not rows:
        click.echo(f"no pods of {deployment.app} in {deployment.namespace}")
        return
    extra_columns = sorted({key for row in rows for key in row.extra})
    table(f"{deployment.cluster.info.name} ({deployment.cluster.backend}, {deployment.mode}, "
          f"namespace {deployment.namespace})",
          ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", "RDMA", *[c.upper() for c in extra_columns],
           "DETAIL"],
          [[row.name, row.node or "-", row.phase, "yes" if row.ready else "no", row.restarts, row.gpus,
            row.ip or "-", row.rdma_devices or "-", *[row.extra.get(c, "") for c in extra_columns],
            row.detail or ""] for row in rows])


@main.command()
@cluster_option
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Directory to sync (default: workspace/ of the project).")
@click.option("--delete", is_flag=True, help="Also delete files in the pods that are not in the source.")
@json_option
@reports_errors
def sync(cluster_ref: str | None, source: Path | None, delete: bool, as_json: bool) -> None:
    """Copy workspace/ to the workspace of every pod, in parallel and incrementally (plus the in-pod runtime)."""
    from mlenv.backends import backend_for
    from mlenv.ops.sync import sync as sync_workspace

    deployment = _active(cluster_ref)
    report = sync_workspace(backend_for(deployment.cluster), deployment, source=source, delete=delete,
                            as_json=as_json)
    sys.exit(0 if report.ok else 1)


@main.command(context_settings={"ignore_unknown_options": True})
@cluster_option
@pod_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@reports_errors
def exec(cluster_ref: str | None, pod: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND on every pod (or --pod N) in parallel, output prefixed [node-N]."""
    from mlenv.backends import backend_for
    from mlenv.ops.fanout import exec_all

    deployment = _active(cluster_ref)
    sys.exit(exec_all(backend_for(deployment.cluster), deployment, list(command), only=pod))


@main.command()
@cluster_option
@pod_option
@reports_errors
def shell(cluster_ref: str | None, pod: int | None) -> None:
    """Interactive shell in pod 0 (or --pod N), in its workspace."""
    from mlenv.backends import backend_for
    from mlenv.ops.fanout import interactive

    deployment = _active(cluster_ref)
    sys.exit(interactive(backend_for(deployment.cluster), deployment, pod or 0))


@main.command()
@cluster_option
@pod_option
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines.")
@reports_errors
def logs(cluster_ref: str | None, pod: int | None, follow: bool) -> None:
    """Logs of every pod (or --pod N), each line prefixed [node-N]."""
    from mlenv.backends import backend_for
    from mlenv.ops.fanout import logs_all

    deployment = _active(cluster_ref)
    sys.exit(logs_all(backend_for(deployment.cluster), deployment, only=pod, follow=follow))


@main.command()
@cluster_option
@click.option("--delete-data", is_flag=True, help="Also delete the PVCs (workspace and datasets). Asks first.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@reports_errors
def clean(cluster_ref: str | None, delete_data: bool, yes: bool) -> None:
    """Delete everything the deployment created; PVCs are kept unless --delete-data."""
    from mlenv import state
    from mlenv.backends import backend_for

    deployment = _active(cluster_ref)
    backend = backend_for(deployment.cluster)
    if delete_data and not yes:
        from mlenv.ops.confirm import confirm_data_deletion

        if not confirm_data_deletion(backend, deployment):
            click.echo("nothing deleted")
            sys.exit(1)
    backend.clean(deployment, delete_data=delete_data)
    state.forget(deployment)


@main.command(context_settings={"ignore_unknown_options": True})
@cluster_option
@click.option("--launcher", type=click.Choice(["torchrun", "deepspeed"]), default="deepspeed", show_default=True)
@click.option("--nproc", type=click.IntRange(min=1), default=None, help="Processes per node.")
@click.option("--args", "args_text", default=None, help="Script arguments as one string (for make ARGS=...).")
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def launch(cluster_ref: str | None, launcher: str, nproc: int | None, args_text: str | None, script: str,
           script_args: tuple[str, ...]) -> None:
    """Start SCRIPT on every node at once through the in-pod runtime; fail-fast, logs in runs/."""
    import shlex

    from mlenv.backends import backend_for
    from mlenv.ops.launch import launch as launch_job

    deployment = _active(cluster_ref)
    arguments = [*script_args, *(shlex.split(args_text) if args_text else [])]
    result = launch_job(backend_for(deployment.cluster), deployment, launcher=launcher, script=script,
                        args=arguments, nproc=nproc)
    sys.exit(result.exit_code)


@main.command("nccl-test")
@cluster_option
@click.option("--nproc", type=click.IntRange(min=1), default=None, help="Processes per node.")
@reports_errors
def nccl_test(cluster_ref: str | None, nproc: int | None) -> None:
    """All-reduce bandwidth across every node, and which transport NCCL really used (fails if RDMA was expected)."""
    from mlenv.backends import backend_for
    from mlenv.ops.nccltest import run_nccl_test

    deployment = _active(cluster_ref)
    sys.exit(run_nccl_test(backend_for(deployment.cluster), deployment, nproc=nproc))


@main.command()
@click.option("--keep", is_flag=True, help="Leave the local cluster running afterwards.")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True)
@reports_errors
def demo(keep: bool, steps: int) -> None:
    """Local 2-node cluster -> sync -> DeepSpeed training -> all-reduce bench -> summary -> clean."""
    from mlenv.ops.demo import run_demo

    sys.exit(run_demo(keep=keep, steps=steps))
