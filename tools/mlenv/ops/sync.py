"""Copy the workspace (and the stdlib in-node runtime) to every node: rsync, over the backend's remote shell
when it has one, else a tar stream over exec when the node has no rsync; parallel, incremental, one copy when
the workspace volume is shared.

What a node's workspace gets: the source minus the built-in and .mlenvignore excludes and minus the source's own
``.mlenv/``, which on the nodes is mlenv's (the runtime, the runs of jobs, the owner mark): never shadowed, never
deleted, even with --delete. The runtime lands in ``.mlenv/mlenv/`` and is always replaced exactly. Without
--delete nothing on a node is removed, nor replaced by an entry of another kind (a file by a directory or the
reverse): such paths are reported as conflicts, found by one dry run of the directories before the copy.

One node costs one rsync with --delete; without, one more: a dry run of the source's directories alone (listed
once for all nodes; none when the source has no directory). A probe over exec comes only after rsync failed over
a remote shell (is rsync missing there? then tar).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from mlenv.config.discover import project_root
from mlenv.core.capabilities import CopyTarget, Handle, Node, NodeAccess
from mlenv.core.remote import PACKAGE, RUNTIME_DIR, runtime_files
from mlenv.errors import ConfigError, OperationError, Problem, UsageError, shown
from mlenv.ui import error, info, print_json, table

MAX_PARALLEL = 8
EXCLUDES = (".git", "__pycache__", "*.pyc", ".DS_Store")
IGNORE_FILE = ".mlenvignore"
RUNTIME = f"{RUNTIME_DIR}/{PACKAGE.name}"
"""Where the runtime goes, relative to the workspace: ``.mlenv/mlenv``."""
RAN = (0, 23, 24)
"""rsync exit codes after which it did its work: all done, some files not copied, some source files vanished."""
REMOTE_SHELL_FAILED = 255
"""rsync's exit code when its remote shell (ssh) could not connect or log in: rsync's own error says why, and a
tar stream would not get further."""
KEEP_MODES = ("--no-perms", "--no-owner", "--no-group", "--executability", "--omit-dir-times")
"""What rsync does not carry over: the source's mode, owner and group, which -a would also set on the node's
existing workspace root (the "." of the copy: 0700 from a temporary directory). A new file gets the source's mode
masked by the node's umask, and the group the directory gives (a setgid team directory's); an existing file keeps
its own; whether a file is executable is carried always. Nor directories' times: only a directory's owner may set
them, and a non-root pod's workspace root is the volume's, made writable to it by its fsGroup (OpenShift's
restricted SCC)."""
UNTAR = ("tar", "--no-overwrite-dir", "-xf", "-")
"""tar on the node, leaving the mode and owner of existing directories (the workspace root) as they are."""
REACH_TIMEOUT = 120
"""Seconds a node that shares the workspace gets to answer (its exec has its own connect timeout)."""
SHOWN_NAMES = 5
SHARED_WITH = "shared with"
PLAIN_EVERY = 10.0
"""Seconds between two progress lines of one node when stderr is not a terminal."""

# What rsync (3.x) and GNU tar print: a directory itemized as new, the messages that name a file, the progress.
NEW_DIR = re.compile(r"^cd\+{9} (.+)/$")
SENDER_PATH = re.compile(r'^rsync: \[sender\] [^"]*"(.*)"')
UNOPENED = re.compile(r"^rsync: \[sender\] send_files failed to open ")
VANISHED = re.compile(r'^file has vanished: "(.*)"')
MAKE_WAY = re.compile(r"^could not make way for new [a-z ]+?: (.*)$")
TRAILER = re.compile(r"^rsync error: ")
SSH_NOTICE = re.compile(r"^(?:Warning: Permanently added |@)")
"""ssh telling that it learned a host key (accept-new), or the banner of its changed-key warning (``@@@...``, the
reason comes after it): not why a copy failed."""
PROGRESS = re.compile(r"^\s*(?P<bytes>[\d,.']+)\s+(?P<percent>\d+)%\s+(?P<rate>\S+/s)")
TAR_PROBLEM = re.compile(r"^tar: (?:\./)?(.*): Cannot \w+: ")
DELETING = re.compile(r"^deleting (.+)$")

Report = Callable[[str], None]


@dataclass(frozen=True)
class PodSync:
    """What the sync did for one pod: ``ok`` only when it got everything (nothing unreadable, no conflict)."""

    pod: str
    node: int
    method: str
    ok: bool
    files: int | None = None
    bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None
    unreadable: tuple[str, ...] = ()
    """Source paths that could not be read (relative to the source); everything else was copied."""
    conflicts: tuple[str, ...] = ()
    """Paths that are a directory on one side and not on the other; kept on the node (no --delete)."""
    deleted: tuple[str, ...] = ()
    """What --delete removed from the node's workspace (a directory once, ending in ``/``)."""

    @property
    def changed(self) -> str:
        """What the copy changed, in words: ``3 files, 1.2 kB`` or ``up to date`` (nothing: not counted)."""
        if self.files is None or self.bytes is None:
            return ""
        if not self.files and not self.bytes:
            return "up to date"
        return f"{self.files} file{'' if self.files == 1 else 's'}, {_size(self.bytes)}"

    @property
    def result(self) -> str:
        """The RESULT cell: ok, FAILED, partial and/or conflict."""
        if self.error is not None:
            return f"FAILED: {shown(self.error)}"
        parts = []
        if self.unreadable:
            count = len(self.unreadable)
            parts.append(f"partial: {count} file{'s' if count > 1 else ''} could not be read: "
                         f"{_names(self.unreadable)}")
        if self.conflicts:
            parts.append(f"conflict: {_names(self.conflicts)}: a directory on one side, not on the other; "
                         "kept as on the node, --delete replaces")
        return "; ".join(parts) or "ok"


@dataclass(frozen=True)
class SyncReport:
    """One row per pod; ``ok`` only when every pod got the workspace."""

    source: str
    shared: bool
    pods: list[PodSync]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no pod failed."""
        return all(p.ok for p in self.pods)


@dataclass(frozen=True)
class Rsync:
    """One finished rsync: its exit code, stdout (itemized changes, stats) and stderr (the problems)."""

    code: int
    out: str
    err: str


@dataclass(frozen=True)
class Plan:
    """What every node gets: the source, the staged runtime, --delete or not, and the source's directories as
    the conflict check reads them (listed once for all nodes; None with --delete or when there is none)."""

    source: Path
    patterns: tuple[str, ...]
    """The source's .mlenvignore patterns."""
    stage: Path
    delete: bool
    directories: Path | None = None


def _names(paths: Sequence[str]) -> str:
    listed = ", ".join(shown(p) for p in paths[:SHOWN_NAMES])
    return listed + (f" and {len(paths) - SHOWN_NAMES} more" if len(paths) > SHOWN_NAMES else "")


def _stage_runtime(stage: Path) -> None:
    """Copy the in-pod runtime (mlenv/__init__.py and mlenv/runtime/, stdlib only) to ``stage``/.mlenv/mlenv,
    keeping file times so that rsync leaves unchanged files alone in the pods."""
    for source, shipped in runtime_files():
        destination = stage / RUNTIME_DIR / shipped
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def _ignore_patterns(source: Path) -> list[str]:
    """The patterns of ``source``/.mlenvignore (rsync syntax, # and ; comments). A ``!`` line (clear the list)
    is bad input: it would clear the rules that keep the nodes' .mlenv/ and the runtime safe too."""
    ignore = source / IGNORE_FILE
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    patterns = []
    for number, line in enumerate(lines, start=1):
        pattern = line.strip()
        if pattern == "!":
            raise ConfigError([Problem(str(ignore), number, None, "", "'!' (clear the list) is not supported: it "
                                       "would clear mlenv's own rules too; list only what to leave out")])
        if pattern and not pattern.startswith(("#", ";")):
            patterns.append(pattern)
    return patterns


def _literal(path: str) -> str:
    """``path`` as an rsync pattern that matches only itself (backslashes escape only in wildcard patterns)."""
    return re.sub(r"([\\*?\[])", r"\\\1", path) if re.search(r"[*?\[]", path) else path


def _rules(patterns: Sequence[str], delete: bool, conflicts: Sequence[str] = ()) -> list[str]:
    """Filter options of the copy, first match wins: the built-in excludes; the runtime always (so that no
    .mlenvignore pattern drops a file of it, and stale ones are deleted); never the source's .mlenv/, never a
    node's (kept even with --delete); without --delete, every other file on a node is protected (rsync runs with
    --delete for the runtime alone; ``P`` rules bind only the receiver); the .mlenvignore ``patterns``; and the
    conflicts."""
    return [*(f"--exclude={p}" for p in EXCLUDES), f"--filter=+ /{RUNTIME}/***", f"--filter=- /{RUNTIME_DIR}",
            *([] if delete else ["--filter=P *"]), *(f"--exclude={p}" for p in patterns),
            *(f"--exclude=/{_literal(c)}" for c in conflicts)]


def _rsh(target: CopyTarget) -> list[str]:
    return ["-e", shlex.join(target.rsh)] if target.rsh else []


def _destination(target: CopyTarget) -> str:
    return target.destination.rstrip("/") + "/"


def _lines(stream: IO[bytes]) -> Iterator[str]:
    """The lines of ``stream`` as they come, ended by a newline or a carriage return (rsync's progress)."""
    pending = b""
    while chunk := os.read(stream.fileno(), 65536):
        *complete, pending = re.split(rb"[\r\n]", pending + chunk)
        yield from (line.decode(errors="surrogateescape") for line in complete)
    if pending:
        yield pending.decode(errors="surrogateescape")


def _run_rsync(argv: Sequence[str], on_line: Report | None = None) -> Rsync:
    """Run rsync, handing each line of its stdout to ``on_line`` as it comes (stderr is read alongside)."""
    errors: list[bytes] = []
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        stdout, stderr = proc.stdout, proc.stderr
        if stdout is None or stderr is None:
            raise RuntimeError("rsync started without pipes")
        reader = threading.Thread(target=lambda: errors.append(stderr.read()), daemon=True)
        reader.start()
        out = []
        for line in _lines(stdout):
            out.append(line)
            if on_line is not None:
                on_line(line)
        reader.join()
    return Rsync(proc.returncode, "\n".join(out), b"".join(errors).decode(errors="surrogateescape"))


def _unescape(text: str) -> str:
    """A name as rsync prints it, with ``\\#ooo`` for the bytes it does not print (a newline, say), as it is."""
    raw = re.sub(rb"\\#([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), text.encode(errors="surrogateescape"))
    return raw.decode(errors="surrogateescape")


def _list_directories(source: Path, patterns: Sequence[str], listing: Path) -> Path | None:
    """Write the directories a copy sends (rsync's own filter semantics: a dry run to nowhere), NUL-separated,
    to ``listing``; None when there is none, so no directory can meet a file on a node."""
    run = _run_rsync(["rsync", "-a", "--dry-run", "--out-format=%n", *_rules(patterns, delete=True), "--filter=+ */",
                      "--filter=- *", f"{source}/", f"{listing}.nowhere/"])
    names = [name for line in run.out.splitlines() if line.endswith("/") and (name := _unescape(line[:-1])) != "."]
    listing.write_bytes(b"".join(os.fsencode(name) + b"\0" for name in names))
    return listing if names else None


def _dry_run(plan: Plan, directories: Path, target: CopyTarget) -> Rsync:
    """Which directories of the source meet a file (or a link) on the node: a dry run of the listed directories
    alone, of those that exist there (``--existing``), so that each one it itemizes as new replaces something."""
    return _run_rsync(["rsync", "-a", "--no-recursive", "--dirs", "--dry-run", "--itemize-changes", "--existing",
                       "--from0", f"--files-from={directories}", *_rsh(target), f"{plan.source}/",
                       _destination(target)])


def _type_changes(dry: Rsync) -> list[str]:
    return [name for line in dry.out.splitlines() if (match := NEW_DIR.match(line))
            and (name := _unescape(match.group(1))) != "."]


def _copy(plan: Plan, target: CopyTarget, conflicts: Sequence[str], on_line: Report) -> Rsync:
    """One rsync: the workspace at the top, the staged runtime under .mlenv/ (``/./`` marks where the relative
    paths start); sparse files stay sparse; --delete always, held back by ``_rules``. ``KEEP_MODES``: the node's
    workspace root (a team's 2775 directory, say) keeps its mode, owner and group."""
    return _run_rsync(["rsync", "-a", *KEEP_MODES, "--relative", "--sparse", "--delete", "--stats",
                       "--info=progress2,del1",
                       *_rsh(target), *_rules(plan.patterns, plan.delete, conflicts), f"{plan.source}/./",
                       f"{plan.stage}/./{RUNTIME}", _destination(target)], on_line)


def _count(pattern: str, text: str) -> int:
    match = re.search(pattern + r":\s*([\d,.']+)", text)
    return int(re.sub(r"\D", "", match.group(1))) if match else 0


def _relative(path: str, source: Path) -> str:
    prefix = f"{source}/"
    return path[len(prefix):] if path.startswith(prefix) else path


def _size_of(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _outcome(pod: Node, run: Rsync, source: Path, conflicts: Sequence[str], started: float) -> PodSync:
    """The row of a copy: rsync's --stats still come after a partial transfer (exit 23 or 24), less the files
    it counted but could not open; the unreadable files and the conflicts are named from its messages."""
    unreadable, unopened, clashes, others = [], [], list(conflicts), []
    for line in (_unescape(line) for line in run.err.splitlines() if line.strip()):
        if match := SENDER_PATH.match(line) or VANISHED.match(line):
            unreadable.append(_relative(match.group(1), source))
            if UNOPENED.match(line):
                unopened.append(unreadable[-1])
        elif match := MAKE_WAY.match(line):
            clashes.append(match.group(1))
        elif not TRAILER.match(line) and not SSH_NOTICE.match(line):
            others.append(line)
    if run.code not in RAN or (run.code and others):
        remote_shell = [line for line in others if not line.startswith("rsync")]  # ssh's last line says why
        said = remote_shell[-1:] if run.code == REMOTE_SHELL_FAILED else []
        error = (said or others or run.err.strip().splitlines() or [f"rsync exit {run.code}"])[0]
        return PodSync(pod.name, pod.ordinal, "rsync", False, seconds=_since(started), error=error,
                       unreadable=tuple(unreadable), conflicts=tuple(clashes), deleted=_deleted(run.out))
    files = _count("Number of regular files transferred", run.out) - len(unopened)
    size = _count("Total transferred file size", run.out) - sum(_size_of(source / name) for name in unopened)
    return PodSync(pod.name, pod.ordinal, "rsync", not unreadable and not clashes, files, size, _since(started),
                   unreadable=tuple(unreadable), conflicts=tuple(clashes), deleted=_deleted(run.out))


def _deleted(out: str) -> tuple[str, ...]:
    """What rsync's ``deleting PATH`` lines name, less the runtime it replaces (mlenv's, not the user's) and what
    lay in a directory it names too."""
    paths = [_unescape(match.group(1)) for line in out.splitlines() if (match := DELETING.match(line))]
    gone = [path for path in paths if path.endswith("/")]
    return tuple(sorted(path for path in paths if not path.startswith(f"{RUNTIME_DIR}/")
                        and not any(path != d and path.startswith(d) for d in gone)))


def _stream(pack: Sequence[str], unpack: Sequence[str]) -> tuple[list[str], str | None]:
    """``pack`` (a local tar) piped into ``unpack`` (an exec on the node); the files tar could not read, and
    the error, if any."""
    with tempfile.TemporaryFile() as problems:
        with subprocess.Popen(pack, stdout=subprocess.PIPE, stderr=problems) as producer:
            result = subprocess.run(unpack, stdin=producer.stdout, capture_output=True, check=False)
        problems.seek(0)
        lines = problems.read().decode(errors="surrogateescape").splitlines()
    unreadable = [match.group(1) for line in lines if (match := TAR_PROBLEM.match(line))]
    if result.returncode != 0:
        return unreadable, (result.stderr.decode(errors="surrogateescape").strip().splitlines()
                            or [f"tar exit {result.returncode} on the node"])[-1]
    if producer.returncode != 0 and not unreadable:
        return unreadable, (lines or [f"tar exit {producer.returncode}"])[-1]
    return unreadable, None


def _tar(backend: NodeAccess, handle: Handle, pod: Node, plan: Plan) -> tuple[list[str], str | None]:
    """Two tar streams through exec (not incremental, nothing deleted but the old runtime): the workspace without
    its .mlenv/, then the runtime, which no .mlenvignore pattern reaches, into a fresh .mlenv/mlenv."""
    excludes = [f"--exclude={p.strip('/')}" for p in (*EXCLUDES, *plan.patterns)]
    unreadable, error = _stream(["tar", f"--exclude=./{RUNTIME_DIR}", *excludes, "-cf", "-", "-C", str(plan.source),
                                 "."],
                                backend.exec_argv(handle, pod, list(UNTAR)))
    if error is None:
        replace = (f"mkdir -p {shlex.quote(RUNTIME_DIR)} && rm -rf {shlex.quote(RUNTIME)} && "
                   f"exec {shlex.join(UNTAR)} -C {shlex.quote(RUNTIME_DIR)}")
        _, error = _stream(["tar", *(f"--exclude={p}" for p in EXCLUDES), "-cf", "-", "-C",
                            str(plan.stage / RUNTIME_DIR), PACKAGE.name],
                           backend.exec_argv(handle, pod, ["sh", "-c", replace]))
    return unreadable, error


def _has_rsync(backend: NodeAccess, handle: Handle, pod: Node) -> bool:
    """Whether rsync is on the node's PATH (asked only after rsync over a remote shell failed)."""
    probe = backend.exec_argv(handle, pod, ["sh", "-c", "command -v rsync"])
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


class _Lines:
    """The latest line of every node: live on a terminal (rich); elsewhere printed when the node is done and at
    most every PLAIN_EVERY seconds while it copies."""

    def __init__(self, live: bool) -> None:
        self.live = live
        self.lines: dict[int, str] = {}
        self.printed: dict[int, float] = {}
        self.lock = threading.Lock()

    def show(self, ordinal: int, text: str, done: bool = False) -> None:
        """Set node ``ordinal``'s line to ``text``."""
        line = f"node-{ordinal}: {text}"
        now = time.monotonic()
        with self.lock:  # also keeps the plain lines of two nodes from running into each other
            self.lines[ordinal] = line
            if self.live or not (done or now - self.printed.setdefault(ordinal, now) >= PLAIN_EVERY):
                return
            self.printed[ordinal] = now
            info(line)

    def render(self) -> Any:
        """Every node's line, in node order."""
        with self.lock:
            return Text("\n".join(self.lines[o] for o in sorted(self.lines)), no_wrap=True, overflow="ellipsis")


@contextmanager
def _progress(message: str) -> Iterator[_Lines]:
    console = Console(stderr=True)
    info(message)
    lines = _Lines(console.is_terminal)
    if not lines.live:
        yield lines
        return
    with Live(console=console, get_renderable=lines.render, refresh_per_second=4, transient=True,
              redirect_stdout=False):
        yield lines


def _size(count: int) -> str:
    """Bytes as people read them: 1.2 GB."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _sync_pod(backend: NodeAccess, handle: Handle, pod: Node, plan: Plan, lines: _Lines) -> PodSync:
    started = time.monotonic()
    target = backend.copy_target(handle, pod)
    copied = [""]

    def on_line(line: str) -> None:
        if match := PROGRESS.match(line):
            copied[0] = f"{match['percent']}% {_size(int(re.sub(r'[^0-9]', '', match['bytes'])))}"
            lines.show(pod.ordinal, f"{copied[0]} {match['rate']}")

    conflicts: list[str] = []
    run = None
    if plan.directories is not None:
        lines.show(pod.ordinal, "looking for conflicts")
        run = _dry_run(plan, plan.directories, target)
        conflicts = _type_changes(run)
    if run is None or run.code in RAN:
        run = _copy(plan, target, conflicts, on_line)
    if (run.code not in RAN and run.code != REMOTE_SHELL_FAILED and target.rsh and pod.ready
            and not _has_rsync(backend, handle, pod)):  # a placeholder node (no allocation) has no exec to ask
        lines.show(pod.ordinal, "tar stream (no rsync on the node)")
        unreadable, error = _tar(backend, handle, pod, plan)
        method = "tar (no rsync on the node: copies all, cannot --delete)" if plan.delete else "tar"
        row = PodSync(pod.name, pod.ordinal, method, error is None and not unreadable, seconds=_since(started),
                      error=error, unreadable=tuple(unreadable))
    else:
        row = _outcome(pod, run, plan.source, conflicts, started)
    lines.show(pod.ordinal, ", ".join(filter(None, [row.changed, row.result])), done=True)
    return row


def _unreachable(backend: NodeAccess, handle: Handle, pod: Node) -> str | None:
    """Why ``pod`` cannot be reached (``true`` run there through exec fails), or None: a host that shares the
    workspace gets no copy of its own, but one it cannot reach must still fail the sync. A node that is only a
    placeholder (a Slurm node without an allocation: the workdir is reached through the login) is not asked."""
    if not pod.ready:
        return None
    try:
        result = subprocess.run(backend.exec_argv(handle, pod, ["true"]), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, errors="surrogateescape", timeout=REACH_TIMEOUT,
                                check=False)
    except subprocess.TimeoutExpired:
        return f"no answer within {REACH_TIMEOUT} s"
    if result.returncode == 0:
        return None
    said = [line for line in result.stderr.splitlines() if line.strip() and not SSH_NOTICE.match(line)]
    return f"cannot be reached: {said[-1] if said else f'exit {result.returncode}'}"


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def sync(backend: NodeAccess, handle: Handle, source: Path | None = None, delete: bool = False,
         as_json: bool = False) -> SyncReport:
    """Sync ``source`` (default: the project's workspace/) to every pod and print a summary."""
    source = (source or project_root() / "workspace").resolve()
    if not source.is_dir():
        raise UsageError(f"nothing to sync: {source} is not a directory (use --source DIR)")
    patterns = tuple(_ignore_patterns(source))  # bad input stops the sync before anything is copied
    if shutil.which("rsync") is None:
        raise OperationError("rsync is not installed on this machine: apt-get install rsync (make install-system)")
    pods = [*backend.nodes(handle), *backend.spares(handle)]  # spares kept current to take a node's place
    shared = handle.shared_workspace
    targets = pods[:1] if shared else pods
    copies = "once (shared workspace)" if shared else f"to {len(targets)} pods"
    notes = [f"{RUNTIME_DIR}/ of the source is not copied: on the nodes it holds mlenv's runtime and runs"
             ] if os.path.lexists(source / RUNTIME_DIR) else []
    parallel = min(MAX_PARALLEL, len(targets))
    with tempfile.TemporaryDirectory(prefix="mlenv-sync-") as staging, \
            _progress(f"syncing {source} {copies}, {parallel} at a time") as lines, \
            ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(pods))) as pool:
        stage = Path(staging)
        _stage_runtime(stage)
        plan = Plan(source, patterns, stage, delete,
                    None if delete else _list_directories(source, patterns, stage / "directories"))
        reached = pool.map(lambda pod: _unreachable(backend, handle, pod), pods[1:] if shared else [])
        rows = list(pool.map(lambda pod: _sync_pod(backend, handle, pod, plan, lines), targets))
    if shared:
        rows += [replace(rows[0], pod=p.name, node=p.ordinal, method=f"{SHARED_WITH} {pods[0].name}", files=None,
                         bytes=None, seconds=0.0, ok=rows[0].ok and why is None, error=why or rows[0].error)
                 for p, why in zip(pods[1:], reached, strict=True)]
    report = SyncReport(str(source), shared, rows, tuple(notes))
    _print(report, as_json)
    return report


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print(report: SyncReport, as_json: bool) -> None:
    if as_json:
        print_json({"ok": report.ok, "source": report.source, "shared": report.shared, "notes": list(report.notes),
                    "pods": [{**asdict(row), "result": row.result} for row in report.pods]})
        return
    table(f"sync {report.source}" + (" (shared workspace: copied once)" if report.shared else ""),
          ["POD", "METHOD", "FILES", "BYTES", "SECONDS", "RESULT"],
          [[r.pod, r.method, _cell(r.files), _cell(r.bytes), r.seconds, r.result] for r in report.pods])
    for note in report.notes:
        info(f"note: {note}")
    sharing = report.pods[1:] if report.shared else []  # the nodes that share the first one's copy
    for row in report.pods:
        if row.deleted and row not in sharing:
            info(f"deleted on node-{row.node} ({row.pod}): {_names(row.deleted)}")
    for row in report.pods:  # a node that shares a failed copy is not blamed for it again
        if not row.ok and not (row in sharing and row.result == report.pods[0].result):
            error(f"sync to {row.pod}: {row.result}")
