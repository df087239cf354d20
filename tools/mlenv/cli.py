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
    from mlenv.render.kubernetes import render as render_kubernetes
    from mlenv.render.kubernetes import to_yaml

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
    """Deploy a cluster's environment and wait until every pod is Ready."""
    from mlenv.errors import UsageError

    if cluster is None:
        raise UsageError("deploy needs a cluster: mlenv deploy NAME|PATH (make deploy-cluster CLUSTER=NAME)")
    deployment = _deployment(cluster, mode, nodes, image)
    if dry_run:
        from mlenv.backends import dry_run_text

        click.echo(dry_run_text(deployment), nl=False)
        return
    from mlenv.backends import backend_for

    backend_for(deployment.cluster).deploy(deployment, timeout=timeout)
