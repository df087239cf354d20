"""The node supervisor: runs the launcher (torchrun, DeepSpeed), whose workers are ``mlenv.runtime.rank`` wrappers,
and knows every rank of this node by its global rank, pid, exit code and signal.

Each rank's output comes through a connection of its own (a unix socket), so lines are whole: they are tagged
``[node-R rN]`` and go to stdout, output.log and the container log, and to the observers. A line a rank updates in
place with ``\\r`` (a progress bar: tqdm writes no newline until its loop ends) is shown on stdout in its latest state,
each state tagged again after its ``\\r``; in the logs and to the observers each finished state is a whole line of
its own. Any bytes from a rank are output (its ``last_output_at``, ``Observer.output``), a whole line or not. The
first rank of the job to fail is named; the job stops on every node (control channel); the node exits with that
rank's own code. What the ranks leave behind ends with the node's share (reaping.py: the share's cgroup), and what
a supervisor killed outright left in $TMPDIR with the next one's start (tempdirs.py). One thread, one selector.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from ..launchers import STOPPING
from ..node.oom import kernel_killed, oom_kills
from ..rank import SOCKET_VARIABLE, signal_name
from ..records.jsonvalue import JsonObject, int_of
from ..records.runlayout import PREEMPTED_MARK, FirstFailure, NodeDir, RankRecord, write_json
from ..records.states import STOP_CODES, Ending, NodeFault, RunState, exit_state
from ..watch.protocol import Observer, RankInfo
from .control import SILENCE_SECONDS, ControlChannel
from .proofs import SECRET_VARIABLE, secret_of
from .rankoutput import Connection, RankOutput, RankState, Reader, Sinks, utc_now
from .reaping import Reaper, marked_processes
from .tempdirs import held_tempdir, remove_stale
from .usersignals import handling_user_signals

STOP_GRACE = 3.0
"""Seconds between the launcher's SIGTERM and SIGKILL for everything of the job, when it must stop (less than
mlenv's own grace for the node's command, so that the supervisor ends its job before it is killed itself)."""
DRAIN_SECONDS = 2.0
"""After the launcher ended, how long output still held open by a rank's leftover children is read."""
TICK = 0.2
JOB_VARIABLE = "MLENV_JOB"


@dataclass
class Supervisor:
    """One node's share of a job. ``run`` it; it returns the node's exit status."""

    argv: Sequence[str]
    env: dict[str, str]
    node: int
    num_nodes: int
    host: str
    node_dir: NodeDir
    observers: Sequence[Observer]
    sinks: Sinks
    control_address: tuple[str, int] | None = None
    grace: float = STOP_GRACE
    silence: float = SILENCE_SECONDS  # a node heard nothing from for this long is lost (the control channel's)

    ranks_by_number: dict[int, RankState] = field(default_factory=dict)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    process: subprocess.Popen[bytes] | None = None
    stop_reason: str | None = None
    stop_code: int | None = None
    kill_at: float | None = None
    user_signal: int | None = None  # the user stopped the job: with this signal here, or on another node
    user_stop_told: bool = False  # the other nodes were told of the user's stop here
    preempted: bool = False  # the stop it took (stop_reason) is a preemption: a pod of the run taken away
    stop_ending: Ending = Ending.OWN  # COLLATERAL: the stop it took is for a node it lost (not its own failure)
    first_failure: FirstFailure | None = None
    local_failure: FirstFailure | None = None
    channel: ControlChannel | None = None
    extra_state: dict[str, object] = field(default_factory=dict)
    current_state: RunState = RunState.RUNNING  # as state.json has it
    oom_before: int | None = None
    marker: bytes = b""  # MLENV_JOB=...: in the environment of every process of the job
    launcher_stopped: int | None = None  # the signal the launcher was first sent to stop it
    stopping_said: bool = False  # launchers.STOPPING was written
    written_ranks: list[JsonObject] | None = None
    run_dir: Path = field(init=False)  # JobControl: this node's attempt directory
    output: RankOutput = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir = self.node_dir.path
        self.output = RankOutput(self.node, self.sinks, self.observers)

    # JobControl -------------------------------------------------------------------------------------------------
    def ranks(self) -> list[RankInfo]:
        return [self.ranks_by_number[number].info for number in sorted(self.ranks_by_number)]

    def note(self, message: str) -> None:
        self.sinks.write(f"mlenv: {message}", note=True)

    def set_state(self, state: RunState, **fields: object) -> None:
        self.extra_state.update(fields)
        self._write_state(state, str(self.extra_state.get("reason") or ""))

    def record(self, **fields: object) -> None:
        self.set_state(self.current_state, **fields)

    @property
    def hub(self) -> bool:
        return self.node == 0 or self.channel is None or not self.channel.connected

    def tell_hub(self, message: JsonObject) -> None:
        if self.hub or self.channel is None:
            self._observer_message(message)
        else:
            self.channel.relay(message)

    def tell_all(self, message: JsonObject) -> None:
        if self.channel is not None and self.node == 0:
            self.channel.relay(message)
        self._observer_message(message)

    def _observer_message(self, message: JsonObject) -> None:
        for observer in self.observers:
            observer.message(message)

    def stop(self, reason: str, exit_code: int) -> None:
        if self.channel is not None:
            self.channel.stop(reason, exit_code)
        else:
            self._stop_here(reason, exit_code, None)

    # the job ----------------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Start the launcher, serve the ranks until everything has ended, return the node's exit status."""
        self.node_dir.path.mkdir(parents=True, exist_ok=True)
        self.oom_before = oom_kills()
        remove_stale(self.note)  # the directories of supervisors killed outright
        with Reaper.start(self.env, self.note) as reaper, held_tempdir() as sockets, self._signals():
            self.extra_state["cgroup"] = str(reaper.cgroup.path) if reaper.cgroup else None
            path = str(Path(sockets, "ranks"))
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(256)
            server.setblocking(False)
            self.selector.register(server, selectors.EVENT_READ, lambda: self._accept(server))
            self._open_channel()
            self._write_ranks()
            self._write_state(RunState.RUNNING, "")
            for observer in self.observers:
                observer.started(self)
            env = {name: value for name, value in self.env.items() if name != SECRET_VARIABLE}  # not the ranks'
            env[SOCKET_VARIABLE] = path
            env.setdefault(JOB_VARIABLE, f"supervisor-{os.getpid()}-{time.time_ns()}")
            self.marker = f"{JOB_VARIABLE}={env[JOB_VARIABLE]}".encode()
            ours, theirs = socket.socketpair()
            # its own session: our signals reach it once, through us (torchrun puts each worker in its own)
            with theirs:
                self.process = subprocess.Popen(list(self.argv), env=env, stdout=theirs.fileno(),
                                                stderr=theirs.fileno(), start_new_session=True,
                                                preexec_fn=reaper.preexec())  # into the cgroup: only os calls
            reaper.started(self.process.pid, self.process.poll() is None, self.note)
            ours.setblocking(False)
            self.selector.register(ours, selectors.EVENT_READ, Reader(self, Connection(ours, kind="launcher")))
            status = self._serve(self.process)
            server.close()
            reaper.end(self.marker, self.grace, self.note)
        return self._finish(status)

    def _serve(self, process: subprocess.Popen[bytes]) -> int:
        next_tick = time.monotonic()
        ended_at: float | None = None
        status = 0
        while True:
            for key, _ in self.selector.select(TICK):
                self._dispatch(key)
            now = time.monotonic()
            if self.channel is not None:
                if self.user_signal is not None and not self.user_stop_told:  # stop every node, as the user's
                    self.user_stop_told = True
                    reason, preempted = self._user_stop()
                    self.channel.stop(reason, 128 + self.user_signal, preempted)
                self.channel.tick()
            if now >= next_tick:
                next_tick = now + 1.0
                self._write_ranks()
                for observer in self.observers:
                    observer.tick(now)
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_at = None
                self._kill(signal.SIGKILL)
            if ended_at is None and (code := process.poll()) is not None:
                self._dispatch_ready()  # the ranks' last words, sent before torchrun could see them end
                status, ended_at = (128 - code if code < 0 else code), now
                if self.stop_reason is None and status != 0 and self.first_failure is None:
                    self._launcher_failed(status)
            if ended_at is None:
                continue
            reading = any(isinstance(key.data, Reader) and key.data.connection.kind in ("output", "launcher")
                          for key in self.selector.get_map().values())
            waiting = self.channel is not None and self.channel.waiting_for_peers()
            if self.channel is not None and not self.channel.finished:
                self.channel.done()
            stopping = self.kill_at is not None and bool(marked_processes(self.marker))  # SIGTERM ignored?
            if (not reading or now - ended_at > DRAIN_SECONDS) and not waiting and not stopping:
                return status

    def _dispatch_ready(self) -> None:
        """Handle everything the connections hold now, without waiting."""
        for _ in range(1000):
            ready = self.selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                self._dispatch(key)

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        """Handle what one connection holds, after saying once that the launcher is being stopped (STOPPING)."""
        if self.launcher_stopped is not None and not self.stopping_said:
            self.stopping_said = True
            self.sinks.write(f"{STOPPING} with {signal_name(self.launcher_stopped)}")
        key.data()

    def _open_channel(self) -> None:
        if self.control_address is None or self.num_nodes < 2:
            return
        secret = secret_of(self.env)
        if secret is None:
            self.note(f"warning: no {SECRET_VARIABLE} in the environment, so no control channel: a failure on "
                      "another node will not stop this one")
            return
        address, port = self.control_address
        self.channel = ControlChannel(self.node, self.num_nodes, address, port, self._stop_here, self.note,
                                      self.selector, on_message=self._observer_message,
                                      attempt=self.node_dir.attempt, run_id=self.env.get("MLENV_RUN_ID", ""),
                                      secret=secret, on_lost=self._lost_node, silence=self.silence)
        self.channel.open()

    def _lost_node(self, node: int, fault: NodeFault) -> None:
        """This node lost ``node`` (silent, closed unannounced; node 0 silent): ``lost_nodes``, its sign."""
        lost = dict(cast(Mapping[str, object], self.extra_state.get("lost_nodes") or {}))
        self.record(lost_nodes={**lost, str(node): fault.to_dict()})

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM/SIGHUP: the user stops the job; each signal is passed on once. Once the job is stopping for
        a reason of its own (a rank failed, here or as told elsewhere; an observer's stop: hang, idle) a stop is the
        job's teardown (the launch's fail-fast stopping the nodes still up), not the user's: it ends as that reason
        says."""
        def handle(signum: int, _frame: object) -> None:
            if self.user_signal == signum:
                return  # the same signal through our group and from our parent: one stop
            if self.first_failure is None and self.stop_reason is None:
                self.user_signal = signum
            self._terminate(signum)

        with handling_user_signals(handle):
            yield

    # connections ------------------------------------------------------------------------------------------------
    def _accept(self, server: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError):
            sock, _ = server.accept()
            sock.setblocking(False)
            connection = Connection(sock)
            self.selector.register(sock, selectors.EVENT_READ, Reader(self, connection))

    def on_closed(self, connection: Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection.sock)
        connection.sock.close()
        rank = self.ranks_by_number.get(connection.rank) if connection.rank is not None else None
        if connection.kind == "control" and rank is not None and rank.record.state is RunState.RUNNING:
            self._rank_exited(rank, 128 + signal.SIGKILL, "SIGKILL")  # the wrapper died without a word

    def on_header(self, connection: Connection, header: JsonObject) -> None:
        connection.kind = str(header.get("kind"))
        number = int_of(header.get("rank", 0), "rank")
        connection.rank = number
        if number not in self.ranks_by_number:
            info = RankInfo(number, int_of(header.get("local_rank", 0), "local_rank"), self.node, self.host, 0)
            record = RankRecord(number, info.local_rank, self.node, self.host, 0, RunState.RUNNING, None, None,
                                utc_now(), None, None)
            self.ranks_by_number[number] = RankState(info, record)

    def on_message(self, connection: Connection, message: JsonObject) -> None:
        rank = self.ranks_by_number[connection.rank or 0]
        if message.get("event") == "started":
            rank.info = replace(rank.info, pid=int_of(message["pid"], "pid"))
            rank.record = replace(rank.record, pid=rank.info.pid)
            self._write_ranks()
            for observer in self.observers:
                observer.rank_started(rank.info)
        elif message.get("event") == "exited":
            self._drain(rank.info.rank)
            signame = message.get("signal")
            self._rank_exited(rank, int_of(message["exit_code"], "exit_code"), str(signame) if signame else None)

    def _drain(self, number: int) -> None:
        """Read what the rank's output connections already hold, before its end is handled."""
        for key in list(self.selector.get_map().values()):
            reader = key.data
            if isinstance(reader, Reader) and reader.connection.kind == "output" \
                    and reader.connection.rank == number:
                reader.drain()

    # rank events ------------------------------------------------------------------------------------------------
    def _rank_exited(self, rank: RankState, exit_code: int, signame: str | None) -> None:
        if rank.record.state is not RunState.RUNNING:
            return
        stopping = self.stop_reason is not None or self.first_failure is not None or self.user_signal is not None
        state = exit_state(exit_code, Ending.COLLATERAL if stopping else Ending.OWN)
        failed = state is RunState.FAILED
        rank.record = replace(rank.record, state=state, exit_code=exit_code, signal=signame, ended_at=utc_now())
        self._write_ranks()
        for observer in self.observers:
            observer.rank_exited(rank.info, exit_code, signame)
        if not failed:
            return
        failure = FirstFailure(rank.info.rank, self.node, exit_code, signame, self._reason(rank, exit_code, signame),
                               list(rank.tail), self._node_fault(), self.host)
        self.local_failure = failure
        self.note(describe(failure, rank.info.pid))
        if self.channel is not None:
            self.channel.failure(failure, time.time())
        self._stop_here(f"stopped after rank {failure.rank} failed", exit_code, failure)

    def _reason(self, rank: RankState, exit_code: int, signame: str | None) -> str:
        if signame == "SIGKILL":
            after = oom_kills()
            if (after is not None and self.oom_before is not None and after > self.oom_before) \
                    or kernel_killed(rank.info.pid):
                return "killed by the kernel's OOM killer"
        return f"killed by {signame}" if signame else f"exited with {exit_code}"

    def _node_fault(self) -> NodeFault | None:
        """The first node-fault sign an observer found on this node (faultsigns.py)."""
        found = (fault for observer in self.observers if (fault := observer.node_fault()) is not None)
        return next(found, None)

    def _launcher_failed(self, status: int) -> None:
        name = Path(self.argv[2] if len(self.argv) > 2 and self.argv[1] == "-m" else self.argv[0]).name
        self.stop(f"the launcher ({name}) exited with {status}", status)

    def _stop_here(self, reason: str, exit_code: int, first: FirstFailure | None, preempted: bool = False) -> None:
        """Stop this node's share (once); the control channel calls this on every node (``preempted``: a pod's)."""
        if first is not None and (self.first_failure is None or self.first_failure.rank != first.rank):
            self.first_failure = first
            for rank in self.ranks_by_number.values():  # ranks that died of it were not the cause
                if rank.record.state is RunState.FAILED and rank.info.rank != first.rank:
                    rank.record = replace(rank.record, state=RunState.STOPPED)
            if first.node != self.node:
                self.note(f"stopping: rank {first.rank} on node-{first.node} {first.reason}")
        if first is None and preempted and self.user_signal is None:  # a rank failed here of it
            self.stop_reason, self.user_signal, self.user_stop_told = None, exit_code - 128, True  # first: preempted
        if self.stop_reason is not None:
            return
        self.stop_reason, self.stop_code, self.preempted = reason, exit_code, preempted
        if self.extra_state.get("lost_nodes"):  # the control channel records the node lost before it stops
            self.stop_ending = Ending.COLLATERAL
        if first is None and exit_code in STOP_CODES and self.user_signal is None:
            self.user_signal, self.user_stop_told = exit_code - 128, True  # the user stopped it on another node
        if first is None:
            self.note(f"stopping the job: {reason}")
        if self.kill_at is None:  # not already stopping (the user's own signal)
            self._terminate(signal.SIGTERM)

    def _terminate(self, signum: int) -> None:
        """SIGTERM (or the user's signal) to the launcher's group; SIGKILL to the whole job after the grace. Only
        signals (a signal handler may call it): ``_dispatch`` says that the launcher is being stopped."""
        if self.process is not None and self.process.poll() is None:
            if self.launcher_stopped is None:
                self.launcher_stopped = signum
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def _kill(self, signum: int) -> None:
        """Everything of the job: the launcher's group and every process carrying the job's marker."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
        for pid in marked_processes(self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    # records ----------------------------------------------------------------------------------------------------
    def _finish(self, status: int) -> int:
        for rank in self.ranks_by_number.values():
            if rank.record.state is RunState.RUNNING:  # its wrapper never reported: killed with the launcher
                rank.record = replace(rank.record, state=RunState.STOPPED, ended_at=utc_now())
        if self.user_signal is not None:  # the user's stop, even when a rank failed of it first somewhere
            (reason, preempted), code = self._user_stop(), 128 + self.user_signal
            state = exit_state(code, Ending.PREEMPTION if preempted else Ending.STOP)
        elif self.first_failure is not None:
            ff = self.first_failure
            state, code = RunState.FAILED, ff.exit_code
            reason = f"rank {ff.rank} {ff.reason}" if ff.node == self.node and self.local_failure == ff \
                else f"stopped after rank {ff.rank} failed"
        elif self.stop_reason is not None:  # stopped for a node it lost, else failed
            code = self.stop_code or 1
            state, reason = exit_state(code, self.stop_ending), self.stop_reason
        else:
            state, reason, code = exit_state(status, Ending.OWN), f"exited with {status}" if status else "", status
        for observer in self.observers:
            code = observer.finished(code)
        if code != 0 and state is RunState.SUCCEEDED:  # an observer's verdict on a job that ended well
            state, reason = exit_state(code, Ending.OWN), str(self.extra_state.get("reason") or f"exited with {code}")
        if self.channel is not None:
            self.channel.close()
        self._write_ranks()
        self._write_state(state, reason)
        return code

    def _user_stop(self) -> tuple[str, bool]:
        """Why the stop signal came and whether it is a preemption: this node's pod being taken away (its PID 1
        marked it) or another node's (its stop said so); else the user's stop."""
        mark = self.env.get(PREEMPTED_MARK)
        if mark and Path(mark).exists():
            return f"{RunState.PREEMPTED}: the pod of node-{self.node} was deleted or evicted", True
        if self.preempted:
            return str(self.stop_reason), True
        return f"stopped by {signal_name(self.user_signal or signal.SIGTERM)}", False

    def _write_ranks(self) -> None:
        records = [self.ranks_by_number[number].record.to_dict() for number in sorted(self.ranks_by_number)]
        if records != self.written_ranks:
            with contextlib.suppress(OSError):
                write_json(self.node_dir.ranks, records)
            self.written_ranks = records

    def _write_state(self, state: RunState, reason: str) -> None:
        self.current_state = state
        data = {**self.extra_state, "state": state, "reason": reason,
                "first_failure": self.first_failure.to_dict() if self.first_failure else None}
        with contextlib.suppress(OSError):
            write_json(self.node_dir.state, data)


def describe(failure: FirstFailure, pid: int) -> str:
    """``rank 3 (node-1, pid 4242) exited with 7 first; last lines: ...``: the job's first failure in one line."""
    tail = " | ".join(line.strip() for line in failure.log_tail[-3:] if line.strip()) or "(none)"
    return f"rank {failure.rank} (node-{failure.node}, pid {pid}) {failure.reason} first; last lines: {tail}"

