"""Each rank's collective progress, without code changes: which ``torch.distributed`` collective (kind, sequence
number, entry time, done or not) every rank last entered, read from PyTorch's flight recorder (which records gloo
collectives as well as NCCL's) by a thread the runtime's sitecustomize starts in the user's process.

The thread never imports torch itself: it waits until the training script has initialised ``torch.distributed``.
It writes the rank's record (the newest :data:`KEEP` collectives of each process group, and ``first_ns``: when the
first collective it saw was entered) every :data:`PERIOD_SECONDS`, within :data:`FIRST_SECONDS` of that first
collective, and at once when ``mlenv stacks`` asks (a newer :data:`REQUEST` file in the directory). A
rank that stops answering keeps its last record, which says when it was written. ``MLENV_COLLECTIVES=off`` turns
the record off. Standard library only.

:func:`culprit` reads the records of every rank: the ranks behind the others in sequence are the ones holding a
hung job ("ranks 0-6 wait in all_reduce #1234; rank 7 last completed #1233").
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ..records.jsonvalue import JsonObject

DIRECTORY_ENV = "MLENV_COLLECTIVES_DIR"
"""Set by the launcher for the whole job: where the ranks' collective records go."""
FILE_ENV = "MLENV_COLLECTIVES_FILE"
"""Set by the rank wrapper for the user's process only: its own record, ``rank<N>.json``."""
SWITCH_ENV = "MLENV_COLLECTIVES"
"""``off`` (or ``0``) turns the record off."""
REQUEST = "request"
"""Touched by ``stacks``: every rank writes its record at once, carrying the request's mtime as its token."""
POLL_SECONDS = 0.2
PERIOD_SECONDS = 10.0
KEEP = 500
"""Collectives kept per process group in a record: the ranks answer a request within POLL_SECONDS of each other, so
their records overlap (for the straggler judgement) up to 1000 collectives a second; small enough to write often."""
FIRST_SECONDS = 1.0
"""Until the rank's first collective is seen, the dump is looked at this often for it (its own entry time is kept,
so looking late costs no precision while the recorder still holds it)."""
ANSWER_SECONDS = 3.0
"""How long ``stacks`` waits for every rank's fresh record."""
SCHEMA = 1


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(SWITCH_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def record_file(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank}.json"


def compact(trace: Mapping[str, Any], keep: int = KEEP) -> list[JsonObject]:
    """The flight recorder's dump (``_dump_fr_trace_json``) as ``[{"group", "entries": [[seq, op, entered_ns,
    done], ...]}]``, the newest ``keep`` collectives of each process group, oldest first; point-to-point
    operations are left out (their sequence is per pair)."""
    groups: dict[str, list[tuple[int, str, int, bool]]] = {}
    for entry in trace.get("entries") or []:
        if entry.get("is_p2p"):
            continue
        name = group_name(entry)
        operation = str(entry.get("profiling_name") or "?").rpartition(":")[2]
        done = bool(entry.get("retired")) or entry.get("state") == "completed"
        groups.setdefault(name, []).append((int(entry.get("collective_seq_id", 0)), operation,
                                            int(entry.get("time_created_ns", 0)), done))
    return [{"group": name, "entries": [[*newest] for newest in sorted(entries)[-keep:]]}
            for name, entries in groups.items()]


def first_entered(trace: Mapping[str, Any]) -> int | None:
    """When the first collective in the flight recorder's dump was entered (ns since the epoch); None without one."""
    times = [int(entry.get("time_created_ns", 0)) for entry in trace.get("entries") or [] if not entry.get("is_p2p")]
    return min((at for at in times if at > 0), default=None)


def group_name(entry: Mapping[str, Any]) -> str:
    """A process group's name as the flight recorder gives it (``default_pg``), else ``pg<id>`` (groups made by
    ``new_group`` without a description are all ``undefined``)."""
    names = [str(name) for name in entry.get("process_group") or []] or [str(entry.get("pg_id", "?"))]
    return names[1] if len(names) > 1 and names[1] not in ("", "undefined") else f"pg{names[0]}"


def _write(path: Path, data: Mapping[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(partial, path)


def _token(directory: Path) -> int:
    try:
        return (directory / REQUEST).stat().st_mtime_ns
    except OSError:
        return 0


def _torch_dump() -> Callable[[], bytes | str] | None:
    """The flight recorder's dump function once the script has initialised ``torch.distributed``; None before."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or getattr(distributed.__spec__, "_initializing", False):
        return None  # not imported, or still being imported by the main thread
    initialized = getattr(distributed, "is_initialized", None)
    if initialized is None or not initialized():
        return None
    c10d = sys.modules["torch"]._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        raise RuntimeError("this PyTorch has no flight recorder dump (_dump_fr_trace_json): PyTorch >= 2.5 has")
    return dump  # type: ignore[no-any-return]


def record_loop(path: Path, period: float = PERIOD_SECONDS, poll: float = POLL_SECONDS) -> None:
    """Write this process's record to ``path`` every ``period`` seconds (and when asked) once torch.distributed
    is up; an error is written once, then the loop ends. Never raises: the training goes on without a record."""
    written_token, written_at, looked_at = -1, 0.0, 0.0
    first_ns: int | None = None
    try:
        while True:
            time.sleep(poll)
            dump = _torch_dump()
            token = _token(path.parent)
            due = token != written_token or time.monotonic() - written_at >= period
            look = first_ns is None and time.monotonic() - looked_at >= FIRST_SECONDS
            if dump is None or not (due or look):
                continue
            trace = json.loads(dump())
            looked_at, seen = time.monotonic(), first_ns
            first_ns = first_entered(trace) if first_ns is None else first_ns
            if not due and first_ns == seen:
                continue
            _write(path, {"schema": SCHEMA, "pid": os.getpid(), "written_at": time.time(), "token": token,
                          "first_ns": first_ns, "groups": compact(trace)})
            written_token, written_at = token, time.monotonic()
    except Exception as exc:
        with contextlib.suppress(OSError):
            _write(path, {"schema": SCHEMA, "pid": os.getpid(), "written_at": time.time(), "token": -1,
                          "error": f"{type(exc).__name__}: {exc}"})


def start_recorder(environ: MutableMapping[str, str]) -> threading.Thread | None:
    """Start the recording thread where the rank wrapper asked for it (``$MLENV_COLLECTIVES_FILE``, taken out of
    the environment so what the rank starts does not record as well)."""
    path = environ.pop(FILE_ENV, None)
    if not path or not enabled(environ):
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    thread = threading.Thread(target=record_loop, args=(Path(path),), name="mlenv-collectives", daemon=True)
    thread.start()
    return thread


def ask(directory: Path) -> int:
    """Ask every rank recording into ``directory`` for a fresh record; the token their answers carry."""
    directory.mkdir(parents=True, exist_ok=True)
    request = directory / REQUEST
    request.touch()
    os.utime(request, ns=(time.time_ns(), time.time_ns()))
    return request.stat().st_mtime_ns


def read(directory: Path, ranks: Iterable[int], token: int | None = None,
         wait: float = ANSWER_SECONDS) -> dict[int, JsonObject]:
    """Each rank's record (``{"error"}`` when it has none or it cannot be read); with ``token``, waits up to
    ``wait`` seconds for records that answer it, and marks the others ``"stale": true``."""
    wanted = sorted(set(ranks))
    deadline = time.monotonic() + wait
    while True:
        found = {rank: _read_one(record_file(directory, rank)) for rank in wanted}
        fresh = all(_answered_token(record) >= (token or 0) or _final(record) for record in found.values())
        if token is None or fresh or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if token is not None:
        for record in found.values():
            if "error" not in record and _answered_token(record) < token:
                record["stale"] = True
    return found


def _final(record: Mapping[str, Any]) -> bool:
    """A record its rank will not write again: the recorder's own error (a missing or torn file may still come)."""
    return "error" in record and "pid" in record


def _answered_token(record: JsonObject) -> int:
    """The token of the request a record answers (0: none)."""
    token = record.get("token", 0)
    return token if isinstance(token, int) else 0


def _read_one(path: Path) -> JsonObject:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"error": "no collective record (the rank has not initialised torch.distributed)"}
    except (OSError, ValueError) as exc:
        return {"error": f"unreadable collective record {path.name}: {exc}"}
    if not isinstance(data, dict) or ("groups" not in data and "error" not in data):
        return {"error": f"unreadable collective record {path.name}: not a record"}
    if "groups" in data and not _well_formed(data["groups"]):
        return {"error": f"unreadable collective record {path.name}: torn entries"}
    return data


def _well_formed(groups: object) -> bool:
    return isinstance(groups, list) and all(
        isinstance(group, dict) and isinstance(group.get("entries"), list)
        and all(isinstance(e, list) and len(e) == 4 and isinstance(e[0], int) for e in group["entries"])
        for group in groups)
