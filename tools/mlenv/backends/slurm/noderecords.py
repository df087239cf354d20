"""What every node's supervisor recorded of a run in the shared run directory (docs/runs.md), read in ONE command on
the login host (sh, like the logs: the login host need not have the runtime's Python), as the shares
``core.runrecords.latest_run`` turns into ``status``'s ``latest_run``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.script import DEPLOYMENT_FILE
from mlenv.runtime.records.restartpolicy import why_faulty
from mlenv.runtime.records.runlayout import LOST_FILE, RankRecord, parse_ranks
from mlenv.runtime.records.states import Ending, NodeFault, RunState, exit_state, parse_faults
from mlenv.runtime.records.timeline import NodeAttempt, share
from mlenv.runtime.supervise.jobs import GONE_REASON, ended_state
from mlenv.runtime.supervise.slurmsteps import ENDED_FILE, STOP_FILE

if TYPE_CHECKING:
    from mlenv.core.runrecords import NodeJob

FILES = ("exit", "state.json", "ranks.json", "record.json")
"""A node's records, read in this order: the exit file first, so that a node that has ended is read with its final
state.json (written before it)."""
EARLIER_FILES = ("state.json", "ranks.json", "record.json")
"""A node's records of an earlier attempt: what its share of the run's goodput is made of (records/timeline.py)."""
SEPARATOR = "\036"
"""Starts each header line of the output: never in a record (JSON escapes control characters; exit is a number)."""
READ = f"""root=$1 run=$2 name=$3 newest=
if [ -z "$run" ]; then
  for dir in "$root"/*; do  # names sort by time, a run's same-second suffix (-2) after it: no slash after them
    [ -d "$dir" ] || continue
    if [ -f "$dir/{DEPLOYMENT_FILE}" ] && [ "$(cat "$dir/{DEPLOYMENT_FILE}")" != "$name" ]; then continue; fi
    run=${{dir##*/}}
  done
fi
[ -n "$run" ] || exit 0
for dir in "$root/$run"/attempt-*; do
  k=${{dir##*/attempt-}}
  case $k in ''|*[!0-9]*) continue ;; esac
  if [ -z "$newest" ] || [ "$k" -gt "$newest" ]; then newest=$k; fi
done
[ -n "$newest" ] || exit 0
printf '{SEPARATOR}attempt %s\\n' "$newest"
[ ! -e "$root/$run/{STOP_FILE}" ] || printf '{SEPARATOR}stopped\\n'
[ ! -s "$root/$run/attempt-$newest/{ENDED_FILE}" ] ||
  printf '{SEPARATOR}ended %s\\n' "$(head -c 32 "$root/$run/attempt-$newest/{ENDED_FILE}")"
if [ -f "$root/$run/attempt-$newest/{LOST_FILE}" ]; then
  printf '{SEPARATOR}lost\\n'
  cat -- "$root/$run/attempt-$newest/{LOST_FILE}" 2>/dev/null
fi
for dir in "$root/$run/attempt-$newest"/node*; do
  node=${{dir##*/node}}
  case $node in ''|*[!0-9]*) continue ;; esac
  for name in {" ".join(FILES)}; do
    [ -f "$dir/$name" ] || continue
    printf '{SEPARATOR}%s %s\\n' "$node" "$name"
    cat -- "$dir/$name" 2>/dev/null
  done
done
for dir in "$root/$run"/attempt-*/node*; do
  node=${{dir##*/node}} k=${{dir%/node*}}
  k=${{k##*/attempt-}}
  case $node in ''|*[!0-9]*) continue ;; esac
  case $k in ''|*[!0-9]*) continue ;; esac
  [ "$k" != "$newest" ] || continue
  for name in {" ".join(EARLIER_FILES)}; do
    [ -f "$dir/$name" ] || continue
    printf '{SEPARATOR}earlier %s %s %s\\n' "$k" "$node" "$name"
    cat -- "$dir/$name" 2>/dev/null
  done
done
"""
"""``sh -c READ sh RUNS_ROOT RUN_ID NAME``: the newest attempt of run RUN_ID (of deployment NAME's newest run when
RUN_ID is empty, never another cluster file's sharing the workdir; run ids sort by time) as ``<SEP>attempt K``,
``<SEP>stopped`` when ``mlenv stop`` stopped it, ``<SEP>ended WORD`` once the script recorded how the attempt
ended, ``<SEP>lost`` and the attempt's lost.json where Slurm lost nodes meanwhile, then each node's records, each
after a line ``<SEP>R NAME``, then each node's records of the earlier attempts, each after ``<SEP>earlier K R NAME``."""


class RunFiles(NamedTuple):
    """What ``read`` found of a run."""

    attempt: int
    """Its newest attempt."""
    files: dict[int, dict[str, str]]
    """Node -> file name -> text, of that attempt."""
    stopped: bool = False
    """Whether ``mlenv stop`` stopped it (its stop file)."""
    lost: Mapping[int, NodeFault] = {}
    """Node -> its ``node-failure`` sign, where Slurm lost the node while the attempt ran (its lost.json)."""
    ended: str | None = None
    """How the attempt ended (runlayout's ATTEMPT_STATES), once the run's script recorded it."""
    earlier: Mapping[int, Mapping[int, Mapping[str, str]]] = {}
    """Node -> earlier attempt -> file name -> text (:data:`EARLIER_FILES`)."""


def read(login: Login, runs_root: str, run_id: str | None, name: str = "") -> RunFiles:
    """The newest attempt of run ``run_id`` (deployment ``name``'s newest run when None) and its nodes' records (0
    and nothing while no node has written)."""
    attempt, stopped, ended = 0, False, None
    lost: dict[int, NodeFault] = {}
    files: dict[int, dict[str, str]] = {}
    earlier: dict[int, dict[int, dict[str, str]]] = {}
    for chunk in login.ok(["sh", "-c", READ, "sh", runs_root, run_id or "", name]).split(SEPARATOR)[1:]:
        header, _, text = chunk.partition("\n")
        what, _, name = header.partition(" ")
        if what == "attempt":
            attempt = int(name)
        elif what == "stopped":
            stopped = True
        elif what == "ended":
            ended = name.strip() or None
        elif what == "lost":
            lost = parse_faults(_json(text))
        elif what.isdigit() and name in FILES:
            files.setdefault(int(what), {})[name] = text
        elif what == "earlier" and len(words := name.split(" ")) == 3 and words[2] in EARLIER_FILES:
            earlier.setdefault(int(words[1]), {}).setdefault(int(words[0]), {})[words[2]] = text
    return RunFiles(attempt, files, stopped, lost, ended, earlier)


def ranks(files: Mapping[str, str]) -> list[RankRecord]:
    """The node's ranks, empty when ranks.json is missing or unreadable."""
    return parse_ranks(_json(files.get("ranks.json")))


def node_job(files: Mapping[str, str], attempt: int, live: bool, stopped: bool = False,
             lost: NodeFault | None = None, earlier: Mapping[int, Mapping[str, str]] | None = None
             ) -> NodeJob | None:
    """One node's share of the run from its ``files``, in the shape of the runtime's ``jobs --json`` entries: ended
    once its exit file is there (the state its state.json says, else the exit code's); else, while the run's step or
    batch job is ``live``, running (or hung, as a watchdog recorded); else failed when its supervisor started and is
    gone without an exit status; else None (nothing known). A run that ``mlenv stop`` ``stopped`` failed of
    nothing: a node that ended failed (Slurm's SIGTERM, or SIGKILL after KillWait) is stopped, without a first
    failure. A node Slurm ``lost`` meanwhile (its ``node-failure`` sign) failed, with that sign, whatever else it
    recorded: never stopped by the user. Its ``attempts``: its share of each attempt, the ``earlier`` ones' (attempt
    -> file name -> text) and this one's."""
    text = files.get("exit", "").strip()
    code = int(text) if text.isdigit() else None
    recorded = _json(files.get("state.json"))
    recorded = recorded if isinstance(recorded, dict) else {}
    if live and code is None:
        state = RunState.HUNG if recorded.get("state") == RunState.HUNG else RunState.RUNNING
    elif code is not None or "record.json" in files or lost is not None:
        state = ended_state(recorded.get("state"), code)
    else:
        return None
    reason = recorded.get("reason") or (None if code is not None or live else GONE_REASON)
    if lost is not None:
        state, reason = RunState.FAILED, why_faulty(lost)
    elif stopped and state is RunState.FAILED:
        state, reason = exit_state(code, Ending.COLLATERAL), "stopped by mlenv stop"
    return {"attempt": attempt, "state": state, "exit_code": code, "reason": reason,
            "first_failure": None if stopped and state is RunState.STOPPED else recorded.get("first_failure"),
            "transport": recorded.get("transport"),
            "stacks": recorded.get("stacks"), "idle": recorded.get("idle"), "stragglers": recorded.get("stragglers"),
            "lost_nodes": recorded.get("lost_nodes"), "ranks": [rank.to_dict() for rank in ranks(files)],
            # the node's own sign only: a supervisor gone without an exit status is not "unreachable" here, since
            # srun kills the other nodes' steps (KillWait) once one failed
            "node_fault": recorded.get("node_fault") or (lost.to_dict() if lost is not None else None),
            "attempts": [found.to_dict() for number, texts in sorted({**(earlier or {}), attempt: files}.items())
                         if (found := _share(number, texts)) is not None]}


def _share(attempt: int, files: Mapping[str, str]) -> NodeAttempt | None:
    """The node's share of ``attempt`` from the text of its records (None without a record.json)."""
    record, recorded = _json(files.get("record.json")), _json(files.get("state.json"))
    node = record.get("node_rank") if isinstance(record, dict) else None
    return share(attempt, node if isinstance(node, int) else -1, record,
                 recorded if isinstance(recorded, dict) else {}, parse_ranks(_json(files.get("ranks.json"))))


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
