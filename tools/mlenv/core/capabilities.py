"""The capabilities a backend may implement (small typed Protocols) and the records they exchange, in the spirit
of TorchX's ``submit_dryrun`` -> ``schedule`` split.

``prepare(plan) -> Request`` is pure (no I/O, no clock, no sockets, no environment reads): the request's text is
what ``render`` and ``deploy --dry-run`` print, and ``apply`` sends exactly it. ``apply`` records the request's
``Handle`` before its first side effect; every later verb works from a handle alone, so a deployment can be
inspected, re-deployed or cleaned even when its cluster file has changed since, or no longer validates.
Launching is split the same way: ``prepare_launch`` (pure) and ``launch``.

What a backend cannot do is said one way, in the spirit of SkyPilot's ``CloudImplementationFeatures``: the
``Feature`` enum below, and each backend's registry entry declaring the features it lacks with the reason
(``BackendInfo.unsupported``); an operation checks what it needs once, before acting (``BackendInfo.require``,
``Backend.need`` for a capability), and a lacking backend is one line, exit 2, naming the backend, the feature and
what to do instead. What a backend supports but refuses for one deployment or run (its settings, its allocation) is
the one other refusal, ``Refused``. A backend implements the capabilities it supports (``Deploy``, ``NodeAccess``,
``Jobs``, ``Checks``); its class declares their Protocols, so mypy checks each signature. The hooks a fan-out
backend (``core.fanout.FanoutJobs``) may override are ``FanoutHooks``, which ``FanoutJobs`` declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from mlenv.errors import UsageError
from mlenv.runtime.records.jsonvalue import JsonObject

if TYPE_CHECKING:
    from mlenv.plan import JobPlan
    from mlenv.runtime.records.runrecord import RunRecord
    from mlenv.runtime.records.states import NodeEnd

CheckStatus = Literal["PASS", "WARN", "FAIL"]
T = TypeVar("T")


@dataclass(frozen=True)
class Handle:
    """How to find and operate a deployment later: recorded in .mlenv/state.json before anything is changed."""

    backend: str
    name: str
    nodes: int
    mode: str
    shared_workspace: bool
    """One workspace for every node (sync copies once)."""
    env: Mapping[str, str]
    """The env contract every node's commands get (MLENV_NODE_RANK is added per node); never a secret."""
    data: Mapping[str, Any]
    """Backend-specific and JsonValue-serialisable: namespace and labels, pod directories, job ids..."""

    def to_json(self) -> JsonObject:
        """The record kept in state."""
        return asdict(self)

    @property
    def namespace(self) -> str | None:
        """The namespace the deployment is in, where its backend records one (Kubernetes, Run:ai, local): what
        ``status`` and ``deploy --json`` show, read here only."""
        namespace = self.data.get("namespace")
        return None if namespace is None else str(namespace)

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Handle:
        """Inverse of ``to_json``; TypeError/ValueError on a record of another shape."""
        handle = cls(**record)
        if not (isinstance(handle.backend, str) and isinstance(handle.name, str) and isinstance(handle.nodes, int)
                and isinstance(handle.env, dict) and isinstance(handle.data, dict)):
            raise TypeError("handle fields have the wrong types")
        return handle

    def decoded(self, decode: Callable[..., T], *args: Any) -> T:
        """``decode(self.data, *args)``: the backend's typed view of what it recorded, made once per handle (every
        verb and helper handed this handle gets the same object); UsageError (naming the deployment and the fix)
        when the record has another shape (KeyError, TypeError, ValueError while decoding)."""
        views: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_views", {})  # beside the frozen fields
        key = (decode, *args)
        if key not in views:
            try:
                views[key] = decode(self.data, *args)
            except (KeyError, TypeError, ValueError) as exc:
                raise UsageError(f"the recorded deployment {self.name} is not a {self.backend} deployment of this "
                                 f"mlenv ({exc!r}); remove it from .mlenv/state.json") from None
        view: T = views[key]
        return view


@dataclass(frozen=True)
class Request:
    """What ``apply`` sends, in the form ``render`` and ``deploy --dry-run`` print."""

    handle: Handle
    text: str
    """Printed by render and deploy --dry-run, byte for byte; apply sends exactly this."""
    files: Mapping[str, str]
    """``render -o DIR``: file name -> content (plain names, no directories but ``admin/``)."""
    payload: Any = None
    """The same request in the backend's own structured form (objects, pods, argv)."""
    extras: Mapping[str, str] = field(default_factory=dict)
    """Named extra outputs (``admin``: what a cluster admin must apply first)."""
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Node:
    """One node (pod, host, Slurm node) of a deployment, as ops need it."""

    ordinal: int
    name: str
    workspace: str
    """Absolute path of the workspace on the node (``/workspace`` in pods, a directory locally)."""
    ip: str | None = None
    ready: bool = False
    machine: str | None = None
    """The machine it runs on where that is not its name (a pod's Kubernetes node): what exclusions name."""

    @property
    def host(self) -> str:
        """The machine a run on this node ran on, as its records and exclusions name it."""
        return self.machine or self.name


@dataclass(frozen=True)
class NodeStatus:
    """One row of ``mlenv status``."""

    name: str
    ordinal: int
    node: str | None
    phase: str
    ready: bool
    restarts: int
    gpus: int
    ip: str | None
    rdma_devices: str | None = None
    detail: str | None = None
    extra: Mapping[str, str | int] = field(default_factory=dict)
    """The backend's own columns (a count as a number: ``{"jobs": 0}``)."""


@dataclass(frozen=True)
class CopyTarget:
    """How rsync reaches a node's workspace: an optional remote shell (``rsync -e``) and a destination."""

    destination: str
    rsh: Sequence[str] | None = None


@dataclass(frozen=True)
class Check:
    """One preflight fact for ``doctor``."""

    name: str
    status: CheckStatus
    evidence: str
    fix: str | None = None
    """The exact command to run or the file field to change."""


@dataclass(frozen=True)
class LaunchSpec:
    """What the user asked ``launch`` to run."""

    launcher: str
    script: str
    args: tuple[str, ...] = ()
    nproc: int | None = None
    run_id: str = "run"
    detach: bool = False
    secrets: tuple[str, ...] = ()
    """Names of local environment variables forwarded for this run only (values never written anywhere)."""
    expect_transport: str | None = None
    """rdma, sockets or any, as the user asked (flag or cluster file); None: the runtime's default for the mode."""
    hang_timeout: float | None = None
    """Seconds without output from any rank after which the watchdog captures every rank's stack (state hung)."""
    on_hang: str | None = None
    """``stop``: the watchdog also stops the job (exit code 124)."""
    max_restarts: int = 0
    """How many times a failed run is started again (--max-restarts, launch.max_restarts)."""
    max_preemptions: int | None = None
    """How many times a preempted attached run resumes (--max-preemptions; None: every time)."""
    attempt: int = 0
    """Which start of the run this is: MLENV_RESTART_COUNT on every node (0 the first)."""
    exclude: tuple[str, ...] = ()
    """Hosts the run must not use (nodes judged faulty); a backend that cannot leave them out refuses."""
    idle_seconds: int | None = None
    """launch.idle_minutes in seconds: every GPU of the job under ``idle_util`` this long flags the run idle."""
    idle_util: float | None = None
    """launch.idle_util: the utilization percent under which a GPU is idle (None: the runtime's default, 5)."""
    on_idle: str | None = None
    """``stop``: the idle watch also stops the job (exit code 125); None or ``warn``: it only says so."""
    on_straggler: str | None = None
    """``exclude``: a straggler's node is left out at the next restart; None or ``warn``: it is only named."""
    node_silence: float | None = None
    """launch.node_silence: seconds a node may stay silent before it is lost (None: the runtime's default)."""

    def watchdog_options(self) -> list[str]:
        """The runtime launch's options for the hang watchdog, the idle-GPU watch, the straggler watch and the
        control channel's silence."""
        idle = ["--idle-seconds", str(self.idle_seconds),
                *(["--idle-util", f"{self.idle_util:g}"] if self.idle_util is not None else []),
                *(["--on-idle", self.on_idle] if self.on_idle == "stop" else [])] if self.idle_seconds else []
        return [*(["--hang-timeout", f"{self.hang_timeout:g}"] if self.hang_timeout else []),
                *(["--on-hang", self.on_hang] if self.on_hang else []), *idle,
                *(["--on-straggler", self.on_straggler] if self.on_straggler == "exclude" else []),
                *(["--node-silence", f"{self.node_silence:g}"] if self.node_silence else [])]


@dataclass(frozen=True)
class LaunchRequest:
    """What ``launch`` runs, in the form ``launch --dry-run`` prints (secret values masked)."""

    spec: LaunchSpec
    text: str
    commands: Mapping[int, Sequence[str]]
    """Node ordinal -> the command run in that node's workspace (backends that start a command per node)."""
    env: Mapping[str, str]
    """Variables added to every node's command for this run (secrets are not here)."""
    payload: Any = None
    """Backend-specific form (Slurm: the batch script)."""
    spares: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    """Node ordinal -> (its excluded host, the spare host that runs it instead) (core.spares)."""


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended: the job's exit code (or mlenv's 1 before it started) and each node's."""

    exit_code: int
    node_exit_codes: Mapping[int, int]
    logs: Mapping[int, str]
    """Node ordinal -> local path of its log, where the job's output was copied."""
    failed_node: int | None = None
    detached: bool = False
    stopped: frozenset[int] = frozenset()
    """Nodes stopped by fail-fast or Ctrl-C before they ended on their own."""
    interrupted: bool = False
    message: str | None = None
    """Why the launch failed before or around the job (a rejected submission, say), in one line."""
    hosts: Mapping[int, str] = field(default_factory=dict)
    """Node ordinal -> the host it ran on, where the backend knows it."""
    preempted: frozenset[int] = frozenset()
    """Nodes taken away under the run (a pod deleted or evicted: preemption, a node drain, ``kubectl delete pod``):
    their ranks got the checkpoint signal; the run resumes as its next attempt once they are back."""


Recorder = Callable[[Handle], None]


@runtime_checkable
class Deploy(Protocol):
    """Deploy and status: make the nodes, say how they are, take them away."""

    name: str

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: the request for ``plan`` (manifests, pod plan, sbatch script, argv) and its handle."""

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Send ``request``; call ``record`` with the handle before the first change (and again whenever the
        handle learns more, e.g. a job id). Converges when run again."""

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Wait, with live progress, until every node is ready (OperationError naming why not); ``record`` keeps
        what the handle learns meanwhile (a master's address)."""

    def status(self, handle: Handle) -> list[NodeStatus]:
        """Every node of the deployment, in ordinal order (empty when nothing exists)."""

    def data_volumes(self, handle: Handle) -> list[str]:
        """What ``clean --delete-data`` deletes beyond the nodes (listed before asking)."""

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Delete what the deployment created and marked as its own (data only when asked); twice is fine."""


@runtime_checkable
class NodeAccess(Protocol):
    """Reach the nodes: list them, run a command on one, copy to it, read its log."""

    name: str

    def nodes(self, handle: Handle) -> list[Node]:
        """The running nodes, in ordinal order; OperationError when there are none."""

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """A local command line that runs ``argv`` on ``node`` in its workspace, with the handle's env contract,
        the node's MLENV_NODE_RANK and ``env``. With ``stop_on_stdin_eof`` the command is stopped when the local
        command's stdin closes (killing the local side stops the remote one too). ``secrets`` are variable names
        whose values the command reads first from stdin, one line each (core.remote)."""

    def spares(self, handle: Handle) -> list[Node]:
        """PURE: the hosts held in reserve to take an excluded node's place (``ssh.spares``), prepared and synced
        like the nodes, their ordinals after the nodes'; empty where the backend keeps none apart from its nodes."""

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """Where rsync copies the workspace of ``node`` to."""

    def logs_argv(self, handle: Handle, node: Node, follow: bool, rank: int | None = None,
                  run_id: str | None = None) -> list[str]:
        """A local command line that prints (or follows, through every attempt) the node's log: the latest run's
        output, or run ``run_id``'s (``rank``: only that global rank's lines; the command exits 2 when the rank did
        not run on the node)."""

    def runtime(self, handle: Handle, *args: str) -> list[str]:
        """``python3 -m mlenv.runtime ARGS`` with the Python that runs the runtime on the nodes (what exec runs)."""

    def runtime_as_launched(self, handle: Handle, node: Node, args: Sequence[str],
                            env: Mapping[str, str]) -> list[str]:
        """A local command line that runs the runtime with ``args`` on ``node`` in the software a launch there gets
        (Slurm: after slurm.setup, inside container:); where launch sets up nothing more, the same as exec."""

    @property
    def torch_fix(self) -> str | None:
        """What doctor names when a node cannot import torch: the fields the backend's launches take their software
        from (None: nothing more to say than doctor's own hint)."""


@runtime_checkable
class Jobs(Protocol):
    """Run jobs: launch (``prepare_launch`` pure, then ``launch``), stop, and what became of a run."""

    name: str

    def prepare_launch(self, handle: Handle, spec: LaunchSpec) -> LaunchRequest:
        """PURE: what ``launch`` would run for ``spec``."""

    def launch(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str],
               log_dir: str) -> LaunchOutcome:
        """Run ``request`` (``secrets``: name -> value, never written); output copied to ``log_dir``."""

    def stop(self, handle: Handle) -> int:
        """Stop the running job on every node (the environment stays); exit code."""

    def run_states(self, handle: Handle, run_id: str) -> dict[int, NodeEnd | None]:
        """Node ordinal -> what became of run ``run_id`` there: its state (docs/runs.md) with the exit code once it
        ended, or None (unknown)."""

    def latest_run(self, handle: Handle, run_id: str) -> RunRecord:
        """Run ``run_id`` as its nodes' supervisors recorded it (its ``to_dict`` is ``status --json``'s
        ``latest_run``, docs/runs.md; its ``nodes`` the ``run_states``)."""

    def runs(self, handle: Handle, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        """Each run of ``run_ids`` as ``latest_run`` reads it (``mlenv runs``), read at once where the backend can;
        a run no node has a record of has state None."""

    def runs_own_ports(self, handle: Handle) -> bool:
        """Every run gets rendezvous and control ports of its own, so a run may start while another one of the
        deployment is live; where not, launch refuses while one is (ops/live.py)."""

    def rank_nodes(self, handle: Handle) -> dict[int, int]:
        """Global rank -> the ordinal of the node it ran on, in each node's newest run."""


class Preemption(NamedTuple):
    """What ``Preempts.take_away`` did."""

    said: str
    """What was done, in words (the drill's evidence)."""
    grace: float
    """The seconds the ranks have between the signal and their end: a checkpoint is due within half."""
    at: float
    """When it was done (epoch seconds): the drill's fault time."""


class FanoutHooks(Protocol):
    """What a backend that inherits ``core.fanout.FanoutJobs`` may override (FanoutJobs declares this Protocol, so
    mypy checks every backend's override against it); FanoutJobs gives each a default."""

    def python(self, handle: Handle) -> str:
        """The Python that runs the runtime on the nodes (default: python3; ssh: its hosts' ``ssh.python``)."""

    def node_names(self, handle: Handle) -> list[str]:
        """The nodes' names in ordinal order, what a spare takes the place of (default: ``nodes``' names); PURE
        where the backend keeps spares."""

    def placement(self, handle: Handle, exclude: Sequence[str]) -> dict[int, tuple[str, str]]:
        """PURE: node ordinal -> (its excluded host, the spare that runs it instead); OperationError when the spares
        are too few (default: ``core.spares.place`` over ``spares``; none where the scheduler places pods
        elsewhere)."""

    def standbys(self, handle: Handle, spec: LaunchSpec, placed: Mapping[int, tuple[str, str]]) -> list[Node]:
        """PURE: the spare hosts a detached run under --max-restarts keeps waiting (default: the spares that run no
        node)."""

    def keep_for_resume(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str]) -> None:
        """Before the nodes start: keep what a node that comes back on its own needs to resume a detached run
        (Kubernetes: the run's Secret); default nothing."""


@runtime_checkable
class Preempts(Protocol):
    """Preempt a run from outside as the backend's scheduler does (``mlenv drill --fault preempt``)."""

    def preemption_refused(self, handle: Handle) -> Refused | None:
        """PURE: why a run of ``handle`` cannot be preempted so (``Feature.TAKE_AWAY``); None where it can."""

    def take_away(self, handle: Handle, node: Node, run_id: str) -> Preemption:
        """Preempt run ``run_id`` at ``node`` as the scheduler would (Kubernetes: the node's pod deleted,
        gracefully; Slurm: the batch job's warning signal); not waiting for its end."""


@runtime_checkable
class Checks(Protocol):
    """Preflight facts for ``doctor``."""

    name: str

    def checks(self, plan: JobPlan) -> list[Check]:
        """Preflight facts for ``doctor``; never stops at the first failure."""


class Feature(Enum):
    """What an operation may need of a backend (the value: what it lets mlenv do, for ``the X backend cannot
    <value>``). A backend supports every feature but those its registry entry declares unsupported."""

    DEPLOY = "deploy, show or clean nodes"
    NODE_ACCESS = "reach its nodes (exec, shell, sync, logs)"
    JOBS = "launch, follow or stop jobs"
    CHECKS = "run preflight checks"
    SPARE_NODES = "hold spare nodes in its deployment (deploy --spares)"
    DISCOVER = "discover a cluster (mlenv discover)"
    NODE_EXCLUSION = "leave a faulty node out of a run (launch --max-restarts, the excluded nodes of mlenv nodes)"
    PREEMPTION = "resume a run whose nodes were taken away under it (launch --max-preemptions)"
    TAKE_AWAY = "preempt a run from outside as its scheduler does (mlenv drill --fault preempt)"


class Refused(UsageError):
    """A backend's refusal of ``feature``, which it supports, for one deployment or run: its settings or its state
    (Slurm: forwarded secrets outside an attached run in an allocation, a preemption without slurm.signal): one line
    naming why and what to do instead, exit 2. The one refusal beside an unsupported ``Feature``."""

    def __init__(self, feature: Feature, message: str) -> None:
        super().__init__(message)
        self.feature = feature


C = TypeVar("C")


@dataclass(frozen=True)
class Capability(Generic[C]):
    """One capability: the feature it is and its Protocol (what ``Backend.need`` hands out)."""

    feature: Feature
    protocol: type[C]


# A Protocol class is what isinstance checks (runtime_checkable), though mypy wants a concrete class for type[C].
DEPLOY = Capability(Feature.DEPLOY, Deploy)  # type: ignore[type-abstract]
NODE_ACCESS = Capability(Feature.NODE_ACCESS, NodeAccess)  # type: ignore[type-abstract]
JOBS = Capability(Feature.JOBS, Jobs)  # type: ignore[type-abstract]
CHECKS = Capability(Feature.CHECKS, Checks)  # type: ignore[type-abstract]
PREEMPTS = Capability(Feature.TAKE_AWAY, Preempts)  # type: ignore[type-abstract]
CAPABILITIES: tuple[Capability[Any], ...] = (DEPLOY, NODE_ACCESS, JOBS, CHECKS, PREEMPTS)
