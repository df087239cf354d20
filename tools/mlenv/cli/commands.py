"""mlenv's commands: their options and what each does, made when one is run or asked for its own help (the
group in ``mlenv.cli`` lists them from COMMANDS without importing this module)."""

# Each command imports the ops, config and ui modules it runs when it runs: at the top they would cost every command,
# status and render included, all the others' (python -X importtime on top of this module: ops.drill ~1.5 s, ops.launch
# ~0.7 s, ops.status ~0.34 s, measured on a busy 2-core host).
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import click

from mlenv.cli import COMMANDS, reports_errors
from mlenv.errors import MlenvError, OperationError, UsageError
from mlenv.runtime.launchers import DEFAULT_LAUNCHER, LAUNCHERS
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue

if TYPE_CHECKING:

    from mlenv.config.model import Cluster
    from mlenv.ops.target import Target
    from mlenv.plan import JobPlan

MADE: dict[str, click.Command] = {}
"""The commands by name, as ``command`` makes them."""


def command(name: str, context_settings: dict[str, bool] | None = None
            ) -> Callable[[Callable[..., Any]], click.Command]:
    """The command ``name`` of COMMANDS, made of the function, with COMMANDS' paragraph for the first of its help
    and the function's docstring for the rest (if it has more to say)."""

    def make(func: Callable[..., Any]) -> click.Command:
        more = [inspect.cleandoc(func.__doc__)] if func.__doc__ else []
        MADE[name] = click.command(name, help="\n\n".join([COMMANDS[name], *more]),
                                   context_settings=context_settings)(func)
        return MADE[name]

    return make


mode_option = click.option("--mode", metavar="rdma|tcp", default=None,  # the plan checks it (plan.MODES)
                           help="Network mode (default: rdma when the cluster has RDMA enabled, else tcp).")
nodes_option = click.option("--nodes", type=click.IntRange(1), default=None,
                            help="Number of nodes; default gpus.default_nodes.")
image_option = click.option("--image", default=None, help="Container image (overrides the cluster file).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (only JSON on stdout).")
cluster_option = click.option("--cluster", "-c", "cluster_ref", default=None, metavar="NAME|PATH",
                              help="Deployment, cluster name or cluster file (default: the current deployment).")
pod_option = click.option("--pod", type=click.IntRange(min=0), default=None, metavar="N",
                          help="Node (pod) ordinal (default: every node, or node 0 for shell).")
STOP_AT_SCRIPT = {"allow_interspersed_args": False}
"""launch: option parsing stops at the script; everything after it belongs to it, and an option launch does not
know before it is a usage error (``--detatch`` is never taken for the script)."""
STOP_AT_COMMAND = {**STOP_AT_SCRIPT, "ignore_unknown_options": True}
"""exec: as launch, and the command may start with what looks like an option."""


def _one_cluster(positional: str | None, option: str | None) -> str | None:
    if positional and option and positional != option:
        raise UsageError(f"two clusters given: {positional!r} and --cluster {option!r}; give one")
    return positional or option


def _plan(cluster_ref: str | None, mode: str | None, nodes: int | None, image: str | None) -> JobPlan:
    """The plan of ``cluster_ref``, or of the current deployment (its mode, nodes and image unless given)."""
    if cluster_ref is not None:
        from mlenv.core.clusters import load_plan

        return load_plan(cluster_ref, mode, nodes, image)
    from dataclasses import replace

    from mlenv import state
    from mlenv.ops.target import recorded_plan

    recorded = state.current()
    recorded = replace(recorded, mode=mode or recorded.mode, nodes=nodes or recorded.nodes,
                       image=image or recorded.image)
    return recorded_plan(recorded)


def _target(cluster_ref: str | None) -> Target:
    from mlenv.ops.target import resolve

    return resolve(cluster_ref)


@command("list")
@json_option
@reports_errors
def list_clusters(as_json: bool) -> None:
    from mlenv.config.discover import cluster_names
    from mlenv.core.clusters import load_cluster
    from mlenv.ui import print_json, table

    listed: list[tuple[str, Cluster | MlenvError]] = []
    for name in cluster_names():
        try:
            listed.append((name, load_cluster(name)))
        except MlenvError as exc:
            listed.append((name, exc))
    if as_json:
        print_json([_listed(name, found) for name, found in listed])
        return
    table(None, ["NAME", "BACKEND", "NODES x GPUS", "RDMA", "STORAGE", "DESCRIPTION"], [
        [name, "-", "-", "-", "-", f"INVALID: {str(found).splitlines()[0]}{_more(len(found.errors()) - 1)} "
                                   f"(mlenv validate {name})"] if isinstance(found, MlenvError) else
        [found.info.name, found.backend, f"{found.gpus.default_nodes} x {found.gpus.per_node}",
         "on" if found.rdma.enabled else "off", _storage_mode(found) or "-", found.info.description or ""]
        for name, found in listed])


def _more(count: int) -> str:
    """`` and N more problems`` (nothing for none)."""
    return f" and {count} more problem{'s' if count > 1 else ''}" if count else ""


def _listed(name: str, found: Cluster | MlenvError) -> JsonObject:
    """A cluster file of ``list --json`` (docs/json.md): what it describes, or why it is not valid."""
    if isinstance(found, MlenvError):
        return {"name": name, "valid": False, "error": str(found).splitlines()[0],
                "errors": list[JsonValue](found.errors())}
    return _summary(found)


def _summary(cluster: Cluster) -> JsonObject:
    return {
        "name": cluster.info.name, "valid": True, "file": cluster.source, "backend": cluster.backend,
        "namespace": cluster.info.namespace, "nodes": cluster.gpus.default_nodes,
        "gpus_per_node": cluster.gpus.per_node, "rdma": cluster.rdma.enabled, "storage_mode": _storage_mode(cluster),
        "description": cluster.info.description,
    }


def _storage_mode(cluster: Cluster) -> str | None:
    """The cluster's storage mode, where its backend uses storage at all."""
    from mlenv.core.registry import BACKENDS

    return cluster.storage.mode if "storage" in BACKENDS[cluster.backend].uses else None


@command("validate")
@click.argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@json_option
@reports_errors
def validate(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None,
             as_json: bool) -> None:
    from mlenv.ops.deploy import prepared

    job = _plan(_one_cluster(cluster, cluster_ref), mode, nodes, None)
    request = prepared(job)
    summary = {"ok": True, **_summary(job.cluster), "mode": job.mode, "nodes": job.nodes,
               "warnings": [*job.warnings, *request.warnings]}
    if as_json:
        from mlenv.ui import print_json

        print_json(summary)
        return
    from mlenv.core.registry import BACKENDS

    storage = (f", {'shared' if job.storage.shared else 'per-node'} workspace"
               if "storage" in BACKENDS[job.cluster.backend].uses else "")
    click.echo(f"OK {job.cluster.source}: {job.name} ({job.cluster.backend}, {job.nodes} x {job.gpus_per_node} "
               f"GPUs, {job.mode}{storage})")


@command("render")
@click.argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@image_option
@click.option("-o", "--output", "output", type=click.Path(), default=None,
              help="Write the files (manifests and kustomization.yaml, or the backend's) into this directory.")
@click.option("--admin", is_flag=True, help="Print only what a cluster admin must apply first (IPC_LOCK SCC + RBAC).")
@reports_errors
def render(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None, image: str | None,
           output: str | None, admin: bool) -> None:
    from mlenv.ops.deploy import prepared

    request = prepared(_plan(_one_cluster(cluster, cluster_ref), mode, nodes, image))
    if output is not None:
        from pathlib import Path

        from mlenv.render.output import write_directory
        from mlenv.ui import info

        written = write_directory(Path(output), request.files)
        info(f"wrote {len(written)} files to {output}")
        return
    if admin:
        if "admin" not in request.extras:
            from mlenv.ui import info

            info("nothing for an admin to apply: security.ipc_lock is false or the backend is not openshift")
            return
        click.echo(request.extras["admin"], nl=False)
        return
    click.echo(request.text, nl=False)


@command("deploy")
@click.argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@image_option
@click.option("--spares", type=click.IntRange(0, 1024), default=0, metavar="K",
              help="Slurm: hold K nodes more than the job uses; a launch runs on the others when nodes are excluded "
                   "(ssh: list spare hosts in ssh.spares). Like --nodes it describes this deploy: deploying again "
                   "without it holds none.")
@click.option("--dry-run", is_flag=True, help="Print exactly what deploy would send (as render does); change nothing.")
@click.option("--timeout", type=click.IntRange(min=1), default=900, show_default=True,
              help="Seconds to wait for every node to be ready.")
@json_option
@reports_errors
def deploy(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None, image: str | None,
           spares: int, dry_run: bool, timeout: int, as_json: bool) -> None:
    """Without CLUSTER, deploys the current deployment again."""
    from mlenv.ops.deploy import deploy as run_deploy
    from mlenv.ops.deploy import prepared, with_excluded, with_spares

    job = with_excluded(with_spares(_plan(_one_cluster(cluster, cluster_ref), mode, nodes, image), spares))
    if dry_run:
        if as_json:
            raise UsageError("--dry-run prints what deploy would send, which is no JSON: leave out --json")
        click.echo(prepared(job).text, nl=False)
        return
    handle = run_deploy(job, image, timeout)
    if as_json:
        from mlenv.ops.status import pod_row
        from mlenv.ops.target import backend_of
        from mlenv.ui import print_json

        rows = backend_of(handle.backend).deploy.status(handle)
        print_json({"ok": True, "name": handle.name, "backend": handle.backend, "mode": handle.mode,
                    "nodes": handle.nodes, "namespace": handle.namespace,
                    "pods": [pod_row(row) for row in rows]})


@command("use")
@click.argument("name")
@reports_errors
def use(name: str) -> None:
    from mlenv import state
    from mlenv.ui import info

    chosen = state.use(name)
    info(f"current deployment: {chosen.name} ({chosen.backend}, {chosen.cluster_file})")


@command("status")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@click.option("--all", "every", is_flag=True, help="Every recorded deployment.")
@click.option("--gpus", is_flag=True, help="Also each node's GPUs (utilisation, memory, temperature, power, ECC), "
              "Xid events since the run started and the ranks' CPU, RSS and last output (asks every node).")
@json_option
@reports_errors
def status(run_id: str | None, cluster_ref: str | None, every: bool, gpus: bool, as_json: bool) -> None:
    from mlenv.ops.status import show

    sys.exit(show(cluster_ref, every, as_json, gpus, run_id))


@command("runs")
@cluster_option
@click.option("--all", "every", is_flag=True, help="Every recorded deployment's runs, and those of the batch jobs "
              "submitted for clusters that are not deployed.")
@json_option
@reports_errors
def runs(cluster_ref: str | None, every: bool, as_json: bool) -> None:
    from mlenv.ops.runs import show

    sys.exit(show(cluster_ref, every, as_json))


@command("stacks")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@pod_option
@click.option("--native", is_flag=True, help="Add native frames (py-spy only; file and line null where unknown).")
@click.option("--method", type=click.Choice(["auto", "py-spy", "faulthandler"]), default="auto", show_default=True,
              help="py-spy (needs ptrace), faulthandler (the signal the runtime armed in every rank), or auto.")
@json_option
@reports_errors
def stacks(run_id: str | None, cluster_ref: str | None, pod: int | None, native: bool, method: str,
           as_json: bool) -> None:
    from mlenv.ops.stacks import take, text
    from mlenv.ui import print_json

    target = _target(cluster_ref)
    if run_id is not None:
        from mlenv.ops.runs import find

        find(target, run_id)
    report = take(target.backend.access, target.handle, pod, native=native, method=method, run_id=run_id)
    if as_json:
        print_json(report.to_json())
    else:
        print(text(report))
    sys.exit(1 if report.unreachable else 0)


@command("top")
@cluster_option
@pod_option
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, metavar="SECONDS",
              help="Time between refreshes.")
@click.option("--count", type=click.IntRange(min=1), default=None, metavar="N",
              help="Refresh N times, then exit (default: until Ctrl-C).")
@reports_errors
def top(cluster_ref: str | None, pod: int | None, interval: float, count: int | None) -> None:
    from mlenv.ops.gpus import top as live

    target = _target(cluster_ref)
    sys.exit(live(target.backend.access, target.handle, pod, interval, count))


@command("sync")
@cluster_option
@click.option("--source", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory to sync (default: workspace/ of the project).")
@click.option("--delete", is_flag=True, help="Also delete files on the nodes that are not in the source, and let a "
              "directory replace a file of the same name (or the reverse); the nodes' .mlenv/ is never touched.")
@json_option
@reports_errors
def sync(cluster_ref: str | None, source: str | None, delete: bool, as_json: bool) -> None:
    from mlenv.ops.sync import sync as sync_workspace

    target = _target(cluster_ref)
    from pathlib import Path

    report = sync_workspace(target.backend.access, target.handle, source=Path(source) if source else None,
                            delete=delete, as_json=as_json)
    sys.exit(0 if report.ok else 1)


@command("exec", context_settings=STOP_AT_COMMAND)
@cluster_option
@pod_option
@json_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@reports_errors
def exec(cluster_ref: str | None, pod: int | None, as_json: bool, command: tuple[str, ...]) -> None:
    from mlenv.ops.fanout import exec_all

    target = _target(cluster_ref)
    argv = list(command[1:] if command[:1] == ("--",) else command)
    sys.exit(exec_all(target.backend.access, target.handle, argv, only=pod, as_json=as_json))


@command("shell")
@cluster_option
@pod_option
@reports_errors
def shell(cluster_ref: str | None, pod: int | None) -> None:
    from mlenv.ops.fanout import interactive

    target = _target(cluster_ref)
    sys.exit(interactive(target.backend.access, target.handle, pod or 0))


@command("logs")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@pod_option
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines, through every attempt of a run "
              "restarted under --max-restarts, until the run ends; then exit with its exit code.")
@click.option("--rank", type=click.IntRange(min=0), metavar="N",
              help="Only the lines of global rank N (exit 2 when the run has no such rank).")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object a line: {"node", "rank", "line"} (docs/json.md).')
@reports_errors
def logs(run_id: str | None, cluster_ref: str | None, pod: int | None, follow: bool, rank: int | None,
         as_json: bool) -> None:
    from mlenv.core.capabilities import Feature
    from mlenv.ops.fanout import logs_all

    target = _target(cluster_ref)
    if run_id is not None:
        from mlenv.ops.runs import find

        find(target, run_id)
    jobs = target.backend.jobs if target.backend.info.supports(Feature.JOBS) else None  # where the ranks ran
    sys.exit(logs_all(target.backend.access, target.handle, only=pod, follow=follow, rank=rank, jobs=jobs,
                      run_id=run_id, as_json=as_json))


@command("stop")
@cluster_option
@json_option
@reports_errors
def stop(cluster_ref: str | None, as_json: bool) -> None:
    from mlenv.ops.fanout import stop_all

    target = _target(cluster_ref)
    sys.exit(stop_all(target.backend.jobs, target.handle, as_json))


@command("clean")
@cluster_option
@click.option("--delete-data", is_flag=True, help="Also delete the data volumes (PVCs, workspaces). Asks first.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@reports_errors
def clean(cluster_ref: str | None, delete_data: bool, yes: bool, as_json: bool) -> None:
    from mlenv import state
    from mlenv.ops.clean import clean as cleaning

    name = None
    if cluster_ref is None and state.load().current is None:  # the current one was cleaned already
        from mlenv.ui import info

        info("nothing to clean: no deployment is current (name one with --cluster)")
    else:
        target = _target(cluster_ref)
        if not cleaning(target, delete_data=delete_data, yes=yes):
            raise OperationError("nothing deleted: not confirmed")
        name = target.handle.name
    if as_json:
        from mlenv.ui import print_json

        print_json({"ok": True, "name": name, "cleaned": name is not None, "data_deleted": delete_data and bool(name)})


@command("launch", context_settings=STOP_AT_SCRIPT)
@cluster_option
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=DEFAULT_LAUNCHER, show_default=True)
@click.option("--nproc", type=click.IntRange(1, 64), default=None, help="Processes per node.")
@click.option("--args", "args_text", default=None, help="Script arguments as one string (for make ARGS=...).")
@click.option("--env", "secrets", multiple=True, metavar="NAME[,NAME]",
              help="Forward NAME from your environment for this run only (never written; masked in --dry-run).")
@click.option("--detach", is_flag=True, help="Start the job and return; mlenv logs -f follows, mlenv stop stops.")
@click.option("--expect-transport", type=click.Choice(["rdma", "sockets", "any"]), default=None,
              help="What NCCL must prove it uses; a contradiction stops the job (default: the cluster file's "
                   "network.expect_transport, else rdma in rdma mode and any otherwise).")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=None, metavar="N",
              help="Start a failed run again, up to N times (same MLENV_RUN_ID, MLENV_RESTART_COUNT the attempt); "
                   "a stop by the user is never restarted (default: launch.max_restarts, else 0). The same error of "
                   "the same rank in two attempts is the script's: the restarts stop, no node is left out. A node "
                   "whose failure shows a node fault is left out, and recorded for later runs; one that failed "
                   "first twice, for this run only. A spare takes its place (ssh.spares, deploy --spares), a Slurm "
                   "batch job goes on with --exclude, else the run stops naming it (exit 1). Also caps a Slurm "
                   "batch job's requeues after the warning (10 without it). docs/runs.md.")
@click.option("--max-preemptions", type=click.IntRange(0, 1000), default=None, metavar="N",
              help="Kubernetes: an attached run whose pods are deleted or evicted under it (preemption, a node "
                   "drain) resumes as its next attempt once they are back (same MLENV_CHECKPOINT_DIR, "
                   "MLENV_RESTART_COUNT + 1), up to N times (default: every time); not counted as --max-restarts.")
@click.option("--dry-run", is_flag=True, help="Print what launch would run on every node; run nothing.")
@click.option("--hang-timeout", type=float, default=None, metavar="SECONDS",
              help="No output from any rank (any bytes: a progress bar's updates count) for this long: capture "
                   "every rank's stack into the run directory, say so, state hung (default: launch.hang_timeout of "
                   "the cluster file, else off).")
@click.option("--on-hang", type=click.Choice(["stop"]), default=None,
              help="With a hang timeout: also stop the job, exit code 124 (as timeout).")
@click.option("--on-idle", type=click.Choice(["stop", "warn"]), default=None,
              help="When every GPU of the job stayed under launch.idle_util (default 5%) for launch.idle_minutes of "
                   "the cluster file, the run is flagged idle (output, status); stop also stops it, exit code 125, "
                   "and it is not restarted under --max-restarts (it would idle again). Default: warn.")
@click.option("--on-straggler", type=click.Choice(["warn", "exclude"]), default=None,
              help="A rank (or node) that enters collectives last and holds the job back is named in the output and "
                   "in status (latest_run.stragglers); exclude also leaves its node out at the next restart, "
                   "recorded with the reason straggler. Default: warn.")
@json_option
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def launch(cluster_ref: str | None, launcher: str, nproc: int | None, args_text: str | None, secrets: tuple[str, ...],
           detach: bool, expect_transport: str | None, dry_run: bool, hang_timeout: float | None,
           on_hang: str | None, on_idle: str | None, max_restarts: int | None, max_preemptions: int | None,
           on_straggler: str | None, as_json: bool, script: str, script_args: tuple[str, ...]) -> None:
    """Everything after SCRIPT belongs to it: `mlenv launch train.py -c cfg.yaml` passes -c cfg.yaml to train.py.
    With --json, prints the run on stdout (its id, cluster, whether detached; an attached run's exit code and first
    failure once it ended), everything else on stderr. Exits with the job's exit code once it started; 124 when
    --on-hang stop stopped a hung job, 125 when --on-idle stop stopped an idle one; 2 while a run of the deployment
    is still running where runs share ports (every backend but ssh and Slurm batch jobs: wait for it, or mlenv stop
    it).
    """
    import shlex

    from mlenv.core.remote import secret_names
    from mlenv.ops import launch as launching

    try:
        extra = shlex.split(args_text) if args_text else []
    except ValueError as exc:
        raise UsageError(f"--args: cannot split {args_text!r} like a shell ({exc}); quote it as in sh") from None
    names = secret_names(secrets)
    settings = launching.settings(cluster_ref, hang_timeout=hang_timeout, on_hang=on_hang, on_idle=on_idle,
                                  expect_transport=expect_transport, max_restarts=max_restarts,
                                  max_preemptions=max_preemptions, on_straggler=on_straggler)
    spec = settings.spec(launcher, script, (*script_args, *extra), nproc, detach, names)
    if dry_run:
        click.echo(launching.dry_run(settings.target, spec), nl=False)
        return
    from mlenv.runtime.records.goodput import describe
    from mlenv.ui import info, print_json, stdout_to_stderr

    with stdout_to_stderr() if as_json else nullcontext():  # the job's own output too: stdout holds only the JSON
        result = launching.launch(settings.target, spec)
    if result.goodput is not None:  # an attached run that ran ends with it, after the summary
        info(describe(result.goodput))
    if as_json:
        print_json(result.to_dict(settings.target.handle.name))
    sys.exit(result.exit_code)


@command("nccl-test")
@cluster_option
@click.option("--nproc", type=click.IntRange(1, 64), default=None, help="Processes per node.")
@click.option("--sizes", default=None, metavar="MIN:MAX[:F]|A,B",
              help="Message sizes, e.g. 8M:1G (doubling), 8M:1G:4 or 1M,64M,1G (default: 1M:1G:4 on GPUs).")
@click.option("--expect", default=None, metavar="BANDWIDTH",
              help="Expected bus bandwidth with its unit, 180GB/s or 1440Gb/s (default: network.expected_busbw, "
                   "else in RDMA mode the link rate x HCAs of the nodes).")
@click.option("--pairs", is_flag=True, help="Bisect the fabric: all-reduce the largest size within disjoint node "
              "pairs at once, in rotating rounds; name the nodes every one of whose pairs is slow (needs 4 nodes).")
@click.option("--exclude-bad", is_flag=True,
              help="With --pairs: record the named nodes as excluded from the next runs.")
@click.option("--read", "read_file", default=None, metavar="FILE",
              help="Judge the output of NVIDIA nccl-tests (all_reduce_perf, ...) in FILE instead of running: "
                   "table, plot, PASS/FAIL (wrong results FAIL; an error or no rows is UNKNOWN).")
@click.option("--tool", type=click.Choice(["nccl-tests"]), default=None,
              help="Run NVIDIA nccl-tests where the nodes have it (network.nccl_tests), not mlenv's benchmark.")
@click.option("--test", "test_name", default=None, metavar="NAME",
              help="With --tool nccl-tests: which test (default all_reduce_perf; all_gather_perf, ...).")
@json_option
@reports_errors
def nccl_test(cluster_ref: str | None, nproc: int | None, sizes: str | None, expect: str | None, pairs: bool,
              exclude_bad: bool, read_file: str | None, tool: str | None, test_name: str | None,
              as_json: bool) -> None:
    if exclude_bad and not pairs:
        raise UsageError("--exclude-bad goes with --pairs, which names the nodes to exclude")
    if test_name is not None and tool is None:
        raise UsageError("--test goes with --tool nccl-tests, which runs that test")
    if read_file is not None:
        given = [name for name, value in (("--pairs", pairs), ("--tool", tool), ("--sizes", sizes),
                                          ("--nproc", nproc), ("--cluster", cluster_ref)) if value]
        if given:
            raise UsageError(f"--read judges a file and runs nothing: it does not go with {', '.join(given)}")
        from pathlib import Path

        from mlenv.ops.nccltests import run_read

        sys.exit(run_read(Path(read_file), expect=expect, as_json=as_json))
    if tool is not None and pairs:
        raise UsageError("--pairs runs mlenv's benchmark: it does not go with --tool")
    if tool is not None:
        from mlenv.ops.nccltests import run_tool

        sys.exit(run_tool(_target(cluster_ref), test=test_name, nproc=nproc, sizes=sizes, expect=expect,
                          as_json=as_json))
    if pairs:
        from mlenv.ops.pairs import run_pairs

        sys.exit(run_pairs(_target(cluster_ref), nproc=nproc, sizes=sizes, expect=expect, as_json=as_json,
                           exclude_bad=exclude_bad))
    from mlenv.ops.nccltest import run_nccl_test

    sys.exit(run_nccl_test(_target(cluster_ref), nproc=nproc, sizes=sizes, expect=expect, as_json=as_json))


@command("drill")
@cluster_option
@click.option("--fault", required=True, metavar="NAME",
              help="What goes wrong: rank-exit (the highest rank exits 1), rank-kill (the node's highest rank "
                   "SIGKILLed), node-loss (the node's supervisor and ranks SIGKILLed), node-freeze (SIGSTOPped), "
                   "hang (one rank SIGSTOPped, a 10 s hang timeout), preempt (where the backend can be preempted), "
                   "all (each in turn).")
@click.option("--at-step", type=click.IntRange(1, 50), default=10, show_default=True,
              help="The training step the fault comes at.")
@click.option("--node", type=click.IntRange(min=0), default=None, metavar="N",
              help="The node the fault goes in at, node 0 (the rendezvous) included; default: the last node. Not "
                   "for rank-exit.")
@json_option
@reports_errors
def drill(cluster_ref: str | None, fault: str, at_step: int, node: int | None, as_json: bool) -> None:
    from mlenv.ops.drill import run_drill

    sys.exit(run_drill(_target(cluster_ref), fault, at_step, as_json, node))


@command("nodes")
@cluster_option
@click.option("--forget-excluded", is_flag=True, help="Clear the excluded nodes: the next runs may use them again.")
@json_option
@reports_errors
def nodes(cluster_ref: str | None, forget_excluded: bool, as_json: bool) -> None:
    from mlenv.ops.nodes import show_excluded

    sys.exit(show_excluded(_target(cluster_ref), forget_excluded, as_json))


@command("doctor")
@click.argument("cluster", required=False)
@cluster_option
@mode_option
@json_option
@reports_errors
def doctor(cluster: str | None, cluster_ref: str | None, mode: str | None, as_json: bool) -> None:
    """With a live deployment recorded (the current one without CLUSTER), also what every node sees and whether the
    nodes agree (HCAs, link rate, GID type, versions, GPUs, clocks).
    """
    from mlenv.ops.doctor import run_doctor

    ref = _one_cluster(cluster, cluster_ref)
    sys.exit(run_doctor(_plan(ref, mode, None, None), ref, as_json))


@command("discover")
@click.argument("name")
@click.option("--namespace", "-n", default=None, help="Namespace to deploy into (default: the context's).")
@click.option("--force", is_flag=True, help="Overwrite clusters/NAME.yaml if it exists.")
@reports_errors
def discover(name: str, namespace: str | None, force: bool) -> None:
    from mlenv.core.registry import discoverer

    discoverer("kubernetes")(name, namespace, force)


@command("demo")
@click.option("--keep", is_flag=True, help="Leave the local cluster running afterwards.")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True)
@reports_errors
def demo(keep: bool, steps: int) -> None:
    from mlenv.ops.demo import run_demo

    sys.exit(run_demo(keep=keep, steps=steps))
