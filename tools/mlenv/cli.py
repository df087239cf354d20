"""The ``mlenv`` command line: parses arguments and prints; the work happens in the modules it imports lazily."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from functools import wraps
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from mlenv.runtime.launchers import DEFAULT_LAUNCHER, LAUNCHERS

if TYPE_CHECKING:

    from mlenv.config.model import Cluster
    from mlenv.ops.target import Target
    from mlenv.plan import JobPlan

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(func: F) -> F:
    """Turn mlenv errors into one-line messages and exit codes (2 bad input, 1 failed); never a traceback. A
    command run with ``--json`` also prints them on stdout as ``{"ok": false, "errors": [...]}`` (docs/json.md)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from mlenv.errors import MlenvError
        from mlenv.ui import error

        try:
            return func(*args, **kwargs)
        except MlenvError as exc:
            error(str(exc))
            _exit_failed(exc.errors(), exc.exit_code, bool(kwargs.get("as_json")))
        except KeyboardInterrupt:
            error("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def _exit_failed(errors: list[dict[str, Any]], exit_code: int, as_json: bool) -> NoReturn:
    """Exit with ``exit_code``; with ``as_json`` the ``errors`` (said on stderr already) go to stdout as JSON."""
    if as_json:
        from mlenv.ui import print_json

        print_json({"ok": False, "errors": errors})
    sys.exit(exit_code)


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option``, its Option made only when its command's parameters are first asked for (``_Command``)."""
    return _later(click.option(*decls, **attrs))


def argument(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.argument``, its Argument made only when its command's parameters are first asked for."""
    return _later(click.argument(*decls, **attrs))


_LATER = "_mlenv_parameters"


def _later(make: Callable[[Any], Any]) -> Callable[[F], F]:
    """A decorator that keeps click's decorator ``make`` on the function (in the order decorators apply: bottom up),
    for its ``_Command`` to apply."""

    def keep(func: F) -> F:
        func.__dict__.setdefault(_LATER, []).append(make)
        return func

    return keep


class _Command(click.Command):
    """A command whose options and arguments are made the first time they are asked for (to parse, for its own
    help), not at import: ``mlenv --help`` lists every command, by name and docstring, without making ~70."""

    def __init__(self, name: str | None, callback: Callable[..., Any] | None = None, **attrs: Any) -> None:
        self._later: list[Callable[[Any], Any]] = list(getattr(callback, _LATER, ()))
        super().__init__(name, callback=callback, **attrs)

    @property
    def params(self) -> list[click.Parameter]:
        """The parameters, top down as declared: click's decorators append theirs to a command they decorate."""
        later, self._later = self._later, []
        for make in reversed(later):
            make(self)
        return self._params

    @params.setter
    def params(self, params: list[click.Parameter]) -> None:
        self._params = params


class _Commands(click.Group):
    """The group of mlenv's commands, with what every command shares at its end: a usage error of a command run
    with ``--json`` is JSON too, and a reader that closed stdout (``mlenv logs | head -1``) ends it quietly with
    exit 0, as ``head`` expects of a writer."""

    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _quiet_when_stdout_goes():  # mlenv --help | head -1
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        words = list(ctx.args)  # the command's arguments, as typed (its name apart)
        with _quiet_when_stdout_goes():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                if exc.ctx is None or not _wants_json(exc.ctx.command, words):
                    raise
                from mlenv.errors import UsageError

                exc.show()
                _exit_failed(UsageError(exc.format_message()).errors(), exc.exit_code, True)


@contextmanager
def _quiet_when_stdout_goes() -> Iterator[None]:
    """Exit 0 at once, saying nothing, when stdout's reader has gone (BrokenPipeError); what is still buffered is
    written here, not at exit."""
    try:
        try:
            yield
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        import os

        with suppress(OSError, ValueError):  # stdout may be no file (click's test runner)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to write at exit
        sys.exit(0)


def _wants_json(command: click.Command, words: list[str]) -> bool:
    """Whether ``command`` has --json and ``words`` give it (before any ``--``)."""
    given = words[:words.index("--")] if "--" in words else words
    return "--json" in given and any(param.name == "as_json" for param in command.params)


mode_option = option("--mode", metavar="rdma|tcp", default=None,  # the plan checks it (plan.MODES)
                     help="Network mode (default: rdma when the cluster has RDMA enabled, else tcp).")
nodes_option = option("--nodes", type=click.IntRange(1), default=None,
                      help="Number of nodes; default gpus.default_nodes.")
image_option = option("--image", default=None, help="Container image (overrides the cluster file).")
json_option = option("--json", "as_json", is_flag=True, help="Machine-readable output (only JSON on stdout).")
cluster_option = option("--cluster", "-c", "cluster_ref", default=None, metavar="NAME|PATH",
                        help="Deployment, cluster name or cluster file (default: the current deployment).")
pod_option = option("--pod", type=click.IntRange(min=0), default=None, metavar="N",
                    help="Node (pod) ordinal (default: every node, or node 0 for shell).")
STOP_AT_SCRIPT = {"allow_interspersed_args": False}
"""launch: option parsing stops at the script; everything after it belongs to it, and an option launch does not
know before it is a usage error (``--detatch`` is never taken for the script)."""
STOP_AT_COMMAND = {**STOP_AT_SCRIPT, "ignore_unknown_options": True}
"""exec: as launch, and the command may start with what looks like an option."""


def _one_cluster(positional: str | None, option: str | None) -> str | None:
    from mlenv.errors import UsageError

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


def _terminal_width() -> int:
    """What shutil.get_terminal_size says ($COLUMNS, else the terminal, else 80), without importing shutil, which
    click would otherwise import to format every help text."""
    import os

    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(1).columns or 80
    except (ValueError, OSError):
        return 80


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                               "terminal_width": _terminal_width()})
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
    from mlenv.config.discover import cluster_names
    from mlenv.core.clusters import load_cluster
    from mlenv.errors import MlenvError
    from mlenv.ui import print_json, table

    rows: list[dict[str, Any]] = []
    for name in cluster_names():
        try:
            cluster = load_cluster(name)
        except MlenvError as exc:
            errors = exc.errors()
            rows.append({"name": name, "valid": False, "error": str(exc).splitlines()[0], "errors": errors})
            continue
        rows.append(_summary(cluster))
    if as_json:
        print_json(rows)
        return
    table(None, ["NAME", "BACKEND", "NODES x GPUS", "RDMA", "STORAGE", "DESCRIPTION"], [
        [r["name"], r.get("backend", "-"),
         f"{r['nodes']} x {r['gpus_per_node']}" if r["valid"] else "-",
         ("on" if r["rdma"] else "off") if r["valid"] else "-",
         r.get("storage_mode") or "-",
         r.get("description") or "" if r["valid"] else
         f"INVALID: {r['error']}{_more(len(r['errors']) - 1)} (mlenv validate {r['name']})"]
        for r in rows])


def _more(count: int) -> str:
    """`` and N more problems`` (nothing for none)."""
    return f" and {count} more problem{'s' if count > 1 else ''}" if count else ""


def _summary(cluster: Cluster) -> dict[str, Any]:
    from mlenv.core.registry import BACKENDS

    return {
        "name": cluster.info.name, "valid": True, "file": cluster.source, "backend": cluster.backend,
        "namespace": cluster.info.namespace, "nodes": cluster.gpus.default_nodes,
        "gpus_per_node": cluster.gpus.per_node, "rdma": cluster.rdma.enabled,
        "storage_mode": cluster.storage.mode if "storage" in BACKENDS[cluster.backend].uses else None,
        "description": cluster.info.description,
    }


@main.command()
@argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@json_option
@reports_errors
def validate(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None,
             as_json: bool) -> None:
    """Check a cluster file (schema, semantics, and what its backend would send); print OK or every problem."""
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


@main.command()
@argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@image_option
@option("-o", "--output", "output", type=click.Path(), default=None,
        help="Write the files (manifests and kustomization.yaml, or the backend's) into this directory.")
@option("--admin", is_flag=True, help="Print only what a cluster admin must apply first (IPC_LOCK SCC + RBAC).")
@reports_errors
def render(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None, image: str | None,
           output: str | None, admin: bool) -> None:
    """Print what deploy sends for a cluster (validated), exactly as deploy --dry-run does."""
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


@main.command()
@argument("cluster", required=False)
@cluster_option
@mode_option
@nodes_option
@image_option
@option("--spares", type=click.IntRange(0, 1024), default=0, metavar="K",
        help="Slurm: hold K nodes more than the job uses; a launch runs on the others when nodes are excluded "
             "(ssh: list spare hosts in ssh.spares). Like --nodes it describes this deploy: deploying again "
             "without it holds none.")
@option("--dry-run", is_flag=True, help="Print exactly what deploy would send (as render does); change nothing.")
@option("--timeout", type=click.IntRange(min=1), default=900, show_default=True,
        help="Seconds to wait for every node to be ready.")
@json_option
@reports_errors
def deploy(cluster: str | None, cluster_ref: str | None, mode: str | None, nodes: int | None, image: str | None,
           spares: int, dry_run: bool, timeout: int, as_json: bool) -> None:
    """Deploy a cluster's environment and wait until every node is ready (re-running converges).

    Without CLUSTER, deploys the current deployment again.
    """
    from mlenv.ops.deploy import deploy as run_deploy
    from mlenv.ops.deploy import prepared, with_excluded, with_spares

    job = with_excluded(with_spares(_plan(_one_cluster(cluster, cluster_ref), mode, nodes, image), spares))
    if dry_run:
        if as_json:
            from mlenv.errors import UsageError

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
                    "nodes": handle.nodes, "namespace": handle.data.get("namespace"),
                    "pods": [pod_row(row) for row in rows]})


@main.command()
@argument("name")
@reports_errors
def use(name: str) -> None:
    """Make the deployment NAME (its name, cluster name or cluster file) the current one."""
    from mlenv import state
    from mlenv.ui import info

    chosen = state.use(name)
    info(f"current deployment: {chosen.name} ({chosen.backend}, {chosen.cluster_file})")


@main.command()
@argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@option("--all", "every", is_flag=True, help="Every recorded deployment.")
@option("--gpus", is_flag=True, help="Also each node's GPUs (utilisation, memory, temperature, power, ECC), "
        "Xid events since the run started and the ranks' CPU, RSS and last output (asks every node).")
@json_option
@reports_errors
def status(run_id: str | None, cluster_ref: str | None, every: bool, gpus: bool, as_json: bool) -> None:
    """Nodes of the current deployment (or --cluster, or --all): node, phase, ready, GPUs, IP, jobs; and its latest
    run (or run RUN_ID, from mlenv runs)."""
    from mlenv.ops.status import show

    sys.exit(show(cluster_ref, every, as_json, gpus, run_id))


@main.command()
@cluster_option
@option("--all", "every", is_flag=True, help="Every recorded deployment's runs, and those of the batch jobs "
        "submitted for clusters that are not deployed.")
@json_option
@reports_errors
def runs(cluster_ref: str | None, every: bool, as_json: bool) -> None:
    """Every run of the current deployment (or --cluster, or --all), newest first: id, script, state, exit code,
    attempts, start, duration, nodes and the first failure. mlenv logs/stacks/status RUN_ID show one."""
    from mlenv.ops.runs import show

    sys.exit(show(cluster_ref, every, as_json))


@main.command()
@argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@pod_option
@option("--native", is_flag=True, help="Add native frames (py-spy only; file and line null where unknown).")
@option("--method", type=click.Choice(["auto", "py-spy", "faulthandler"]), default="auto", show_default=True,
        help="py-spy (needs ptrace), faulthandler (the signal the runtime armed in every rank), or auto.")
@json_option
@reports_errors
def stacks(run_id: str | None, cluster_ref: str | None, pod: int | None, native: bool, method: str,
           as_json: bool) -> None:
    """Python stack of every rank of the latest run (or of run RUN_ID while it runs; of --pod N's), grouped: the odd
    ones out first."""
    from mlenv.ops.stacks import take, text
    from mlenv.ui import print_json

    target = _target(cluster_ref)
    if run_id is not None:
        from mlenv.ops.runs import find

        find(target, run_id)
    report = take(target.backend.access, target.handle, pod, native=native, method=method, run_id=run_id)
    if as_json:
        print_json(report)
    else:
        print(text(report))
    sys.exit(1 if report["unreachable"] else 0)


@main.command()
@cluster_option
@pod_option
@option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, metavar="SECONDS",
        help="Time between refreshes.")
@option("--count", type=click.IntRange(min=1), default=None, metavar="N",
        help="Refresh N times, then exit (default: until Ctrl-C).")
@reports_errors
def top(cluster_ref: str | None, pod: int | None, interval: float, count: int | None) -> None:
    """Live GPU state of every node (or --pod N): GPUs, Xid/ECC events, the job's ranks' CPU, RSS, last output."""
    from mlenv.ops.gpus import top as live

    target = _target(cluster_ref)
    sys.exit(live(target.backend.access, target.handle, pod, interval, count))


@main.command()
@cluster_option
@option("--source", type=click.Path(exists=True, file_okay=False), default=None,
        help="Directory to sync (default: workspace/ of the project).")
@option("--delete", is_flag=True, help="Also delete files on the nodes that are not in the source, and let a "
        "directory replace a file of the same name (or the reverse); the nodes' .mlenv/ is never touched.")
@json_option
@reports_errors
def sync(cluster_ref: str | None, source: str | None, delete: bool, as_json: bool) -> None:
    """Copy workspace/ to the workspace of every node, in parallel and incrementally (plus the runtime)."""
    from mlenv.ops.sync import sync as sync_workspace

    target = _target(cluster_ref)
    from pathlib import Path

    report = sync_workspace(target.backend.access, target.handle, source=Path(source) if source else None,
                            delete=delete, as_json=as_json)
    sys.exit(0 if report.ok else 1)


@main.command(context_settings=STOP_AT_COMMAND)
@cluster_option
@pod_option
@json_option
@argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@reports_errors
def exec(cluster_ref: str | None, pod: int | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND on every node (or --pod N) in parallel, output prefixed [node-N] (--json: each node's exit code
    and output at the end)."""
    from mlenv.ops.fanout import exec_all

    target = _target(cluster_ref)
    argv = list(command[1:] if command[:1] == ("--",) else command)
    sys.exit(exec_all(target.backend.access, target.handle, argv, only=pod, as_json=as_json))


@main.command()
@cluster_option
@pod_option
@reports_errors
def shell(cluster_ref: str | None, pod: int | None) -> None:
    """Interactive shell on node 0 (or --pod N), in its workspace; stdin not a terminal: runs what it reads."""
    from mlenv.ops.fanout import interactive

    target = _target(cluster_ref)
    sys.exit(interactive(target.backend.access, target.handle, pod or 0))


@main.command()
@argument("run_id", required=False, metavar="[RUN_ID]")
@cluster_option
@pod_option
@option("-f", "--follow", is_flag=True, help="Keep streaming new lines, through every attempt of a run "
        "restarted under --max-restarts, until the run ends; then exit with its exit code.")
@option("--rank", type=click.IntRange(min=0), metavar="N",
        help="Only the lines of global rank N (exit 2 when the run has no such rank).")
@option("--json", "as_json", is_flag=True,
        help='One JSON object a line: {"node", "rank", "line"} (docs/json.md).')
@reports_errors
def logs(run_id: str | None, cluster_ref: str | None, pod: int | None, follow: bool, rank: int | None,
         as_json: bool) -> None:
    """The latest run's output (or run RUN_ID's, from mlenv runs) on every node (or --pod N): every rank's lines
    whole, tagged [node-N rR]; every attempt of a restarted run, each under its header."""
    from mlenv.core.capabilities import Feature
    from mlenv.ops.fanout import logs_all

    target = _target(cluster_ref)
    if run_id is not None:
        from mlenv.ops.runs import find

        find(target, run_id)
    jobs = target.backend.jobs if target.backend.info.supports(Feature.JOBS) else None  # where the ranks ran
    sys.exit(logs_all(target.backend.access, target.handle, only=pod, follow=follow, rank=rank, jobs=jobs,
                      run_id=run_id, as_json=as_json))


@main.command()
@cluster_option
@json_option
@reports_errors
def stop(cluster_ref: str | None, as_json: bool) -> None:
    """Stop the running job on every node; the environment stays (a finished run is left as it is)."""
    from mlenv.ops.fanout import stop_all

    target = _target(cluster_ref)
    sys.exit(stop_all(target.backend.jobs, target.handle, as_json))


@main.command()
@cluster_option
@option("--delete-data", is_flag=True, help="Also delete the data volumes (PVCs, workspaces). Asks first.")
@option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@reports_errors
def clean(cluster_ref: str | None, delete_data: bool, yes: bool, as_json: bool) -> None:
    """Delete everything the deployment created; data volumes are kept unless --delete-data. Twice is fine: with
    nothing (left) to delete it says so and exits 0."""
    from mlenv import state
    from mlenv.errors import OperationError
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


@main.command(context_settings=STOP_AT_SCRIPT)
@cluster_option
@option("--launcher", type=click.Choice(LAUNCHERS), default=DEFAULT_LAUNCHER, show_default=True)
@option("--nproc", type=click.IntRange(1, 64), default=None, help="Processes per node.")
@option("--args", "args_text", default=None, help="Script arguments as one string (for make ARGS=...).")
@option("--env", "secrets", multiple=True, metavar="NAME[,NAME]",
        help="Forward NAME from your environment for this run only (never written; masked in --dry-run).")
@option("--detach", is_flag=True, help="Start the job and return; mlenv logs -f follows, mlenv stop stops.")
@option("--expect-transport", type=click.Choice(["rdma", "sockets", "any"]), default=None,
        help="What NCCL must prove it uses; a contradiction stops the job (default: the cluster file's "
             "network.expect_transport, else rdma in rdma mode and any otherwise).")
@option("--max-restarts", type=click.IntRange(0, 100), default=None, metavar="N",
        help="Start a failed run again, up to N times (same MLENV_RUN_ID, MLENV_RESTART_COUNT the attempt); "
             "a stop by the user is never restarted (default: launch.max_restarts, else 0). The same error of "
             "the same rank in two attempts is the script's: the restarts stop, no node is left out. A node "
             "whose failure shows a node fault is left out, and recorded for later runs; one that failed "
             "first twice, for this run only. A spare takes its place (ssh.spares, deploy --spares), a Slurm "
             "batch job goes on with --exclude, else the run stops naming it (exit 1). Also caps a Slurm "
             "batch job's requeues after the warning (10 without it). docs/runs.md.")
@option("--max-preemptions", type=click.IntRange(0, 1000), default=None, metavar="N",
        help="Kubernetes: an attached run whose pods are deleted or evicted under it (preemption, a node "
             "drain) resumes as its next attempt once they are back (same MLENV_CHECKPOINT_DIR, "
             "MLENV_RESTART_COUNT + 1), up to N times (default: every time); not counted as --max-restarts.")
@option("--dry-run", is_flag=True, help="Print what launch would run on every node; run nothing.")
@option("--hang-timeout", type=float, default=None, metavar="SECONDS",
        help="No output from any rank (any bytes: a progress bar's updates count) for this long: capture "
             "every rank's stack into the run directory, say so, state hung (default: launch.hang_timeout of "
             "the cluster file, else off).")
@option("--on-hang", type=click.Choice(["stop"]), default=None,
        help="With a hang timeout: also stop the job, exit code 124 (as timeout).")
@option("--on-idle", type=click.Choice(["stop", "warn"]), default=None,
        help="When every GPU of the job stayed under launch.idle_util (default 5%) for launch.idle_minutes of "
             "the cluster file, the run is flagged idle (output, status); stop also stops it, exit code 125, "
             "and it is not restarted under --max-restarts (it would idle again). Default: warn.")
@option("--on-straggler", type=click.Choice(["warn", "exclude"]), default=None,
        help="A rank (or node) that enters collectives last and holds the job back is named in the output and "
             "in status (latest_run.stragglers); exclude also leaves its node out at the next restart, "
             "recorded with the reason straggler. Default: warn.")
@json_option
@argument("script")
@argument("script_args", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def launch(cluster_ref: str | None, launcher: str, nproc: int | None, args_text: str | None, secrets: tuple[str, ...],
           detach: bool, expect_transport: str | None, dry_run: bool, hang_timeout: float | None,
           on_hang: str | None, on_idle: str | None, max_restarts: int | None, max_preemptions: int | None,
           on_straggler: str | None, as_json: bool, script: str, script_args: tuple[str, ...]) -> None:
    """Start SCRIPT on every node at once through the runtime; fail-fast, logs in runs/.

    Everything after SCRIPT belongs to it: `mlenv launch train.py -c cfg.yaml` passes -c cfg.yaml to train.py.
    With --json, prints the run on stdout (its id, cluster, whether detached; an attached run's exit code and first
    failure once it ended), everything else on stderr. Exits with the job's exit code once it started; 124 when
    --on-hang stop stopped a hung job, 125 when --on-idle stop stopped an idle one; 2 while a run of the deployment
    is still running where runs share ports (every backend but ssh and Slurm batch jobs: wait for it, or mlenv stop
    it).
    """
    import shlex

    from mlenv.core.remote import secret_names
    from mlenv.errors import UsageError
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
        info(describe(dict(result.goodput)))
    if as_json:
        print_json(result.to_dict(settings.target.handle.name))
    sys.exit(result.exit_code)


@main.command("nccl-test")
@cluster_option
@option("--nproc", type=click.IntRange(1, 64), default=None, help="Processes per node.")
@option("--sizes", default=None, metavar="MIN:MAX[:F]|A,B",
        help="Message sizes, e.g. 8M:1G (doubling), 8M:1G:4 or 1M,64M,1G (default: 1M:1G:4 on GPUs).")
@option("--expect", default=None, metavar="BANDWIDTH",
        help="Expected bus bandwidth with its unit, 180GB/s or 1440Gb/s (default: network.expected_busbw, "
             "else in RDMA mode the link rate x HCAs of the nodes).")
@option("--pairs", is_flag=True, help="Bisect the fabric: all-reduce the largest size within disjoint node "
        "pairs at once, in rotating rounds; name the nodes every one of whose pairs is slow (needs 4 nodes).")
@option("--exclude-bad", is_flag=True,
        help="With --pairs: record the named nodes as excluded from the next runs.")
@option("--read", "read_file", default=None, metavar="FILE",
        help="Judge the output of NVIDIA nccl-tests (all_reduce_perf, ...) in FILE instead of running: "
             "table, plot, PASS/FAIL (wrong results FAIL; an error or no rows is UNKNOWN).")
@option("--tool", type=click.Choice(["nccl-tests"]), default=None,
        help="Run NVIDIA nccl-tests where the nodes have it (network.nccl_tests), not mlenv's benchmark.")
@option("--test", "test_name", default=None, metavar="NAME",
        help="With --tool nccl-tests: which test (default all_reduce_perf; all_gather_perf, ...).")
@json_option
@reports_errors
def nccl_test(cluster_ref: str | None, nproc: int | None, sizes: str | None, expect: str | None, pairs: bool,
              exclude_bad: bool, read_file: str | None, tool: str | None, test_name: str | None,
              as_json: bool) -> None:
    """The fabric gate: all-reduce busbw per size, NCCL's transport per rank, PASS at >= 80 % of the expected
    bandwidth (RDMA asked and sockets used: FAIL); results and a plot under runs/. Exit 1 on FAIL, or with
    --pairs when a node is named slow. --read FILE judges an nccl-tests output instead (exit 1 on FAIL, and on
    UNKNOWN under --expect)."""
    from mlenv.errors import UsageError

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


@main.command()
@cluster_option
@option("--fault", required=True, metavar="NAME",
        help="What goes wrong: rank-exit (a rank exits 1), rank-kill (SIGKILL), node-loss (the last node's "
             "supervisor and ranks SIGKILLed), node-freeze (SIGSTOPped), hang (one rank SIGSTOPped, a 10 s "
             "hang timeout), preempt (where the backend can be preempted), all (each in turn).")
@option("--at-step", type=click.IntRange(1, 50), default=10, show_default=True,
        help="The training step the fault comes at.")
@json_option
@reports_errors
def drill(cluster_ref: str | None, fault: str, at_step: int, as_json: bool) -> None:
    """How fast the deployment recovers: a small built-in training job (its own run and checkpoints) under
    --max-restarts 1, one fault at a step, each phase timed from the runtime's records (detected and named, every
    rank stopped, next attempt started, training resumed at the checkpointed step) against drill.targets; a table
    or --json, and runs/<id>/timeline.png. Exit 1 when a phase FAILs; 2 with a run live (nothing started)."""
    from mlenv.ops.drill import run_drill

    sys.exit(run_drill(_target(cluster_ref), fault, at_step, as_json))


@main.command()
@cluster_option
@option("--forget-excluded", is_flag=True, help="Clear the excluded nodes: the next runs may use them again.")
@json_option
@reports_errors
def nodes(cluster_ref: str | None, forget_excluded: bool, as_json: bool) -> None:
    """Where the deployment's nodes run now (a pod's Kubernetes node), and the nodes excluded from its next runs (by
    nccl-test --pairs --exclude-bad or restarts), and why."""
    from mlenv.ops.nodes import show_excluded

    sys.exit(show_excluded(_target(cluster_ref), forget_excluded, as_json))


@main.command()
@argument("cluster", required=False)
@cluster_option
@mode_option
@json_option
@reports_errors
def doctor(cluster: str | None, cluster_ref: str | None, mode: str | None, as_json: bool) -> None:
    """Preflight checklist for a cluster: PASS/WARN/FAIL, the evidence and the fix; exit 1 on any FAIL.

    With a live deployment recorded (the current one without CLUSTER), also what every node sees and whether the
    nodes agree (HCAs, link rate, GID type, versions, GPUs, clocks).
    """
    from mlenv.ops.doctor import run_doctor

    ref = _one_cluster(cluster, cluster_ref)
    sys.exit(run_doctor(_plan(ref, mode, None, None), ref, as_json))


@main.command()
@argument("name")
@option("--namespace", "-n", default=None, help="Namespace to deploy into (default: the context's).")
@option("--force", is_flag=True, help="Overwrite clusters/NAME.yaml if it exists.")
@reports_errors
def discover(name: str, namespace: str | None, force: bool) -> None:
    """Write clusters/NAME.yaml from the logged-in cluster: GPU nodes, storage classes, RDMA networks; TODO
    comments mark what a person must decide."""
    from mlenv.core.registry import discoverer

    discoverer("kubernetes")(name, namespace, force)


@main.command()
@option("--keep", is_flag=True, help="Leave the local cluster running afterwards.")
@option("--steps", type=click.IntRange(min=1), default=30, show_default=True)
@reports_errors
def demo(keep: bool, steps: int) -> None:
    """Local 2-node cluster -> sync -> DeepSpeed training -> all-reduce bench -> summary -> clean."""
    from mlenv.ops.demo import run_demo

    sys.exit(run_demo(keep=keep, steps=steps))
