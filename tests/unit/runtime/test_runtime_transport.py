"""The live transport proof as the supervisor drives it: lines, ticks, the end of the job, the nodes' messages. A
recording JobControl stands for the supervisor and its control channel (the observer is what is tested;
test_runtime_launcher runs it under the real supervisor)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlenv.runtime.fabric.ncclog import parse_nccl_log
from mlenv.runtime.watch.protocol import RankInfo
from mlenv.runtime.watch.transportproof import Expectation, TransportProof, debug_env, expectation, why_unproven


@dataclass
class Recorder:
    """What the observer asked of the job."""

    run_dir: Path = Path("/nonexistent")
    notes: list[str] = field(default_factory=list)
    states: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    stops: list[tuple[str, int]] = field(default_factory=list)
    peers: list[Recorder] = field(default_factory=list)  # every node's, the hub's first (none: a single node)
    observer: TransportProof | None = None

    @property
    def hub(self) -> bool:
        return not self.peers or self.peers[0] is self

    def tell_hub(self, message: dict[str, Any]) -> None:
        (self.peers[0] if self.peers else self).deliver(message)

    def tell_all(self, message: dict[str, Any]) -> None:
        for recorder in self.peers or [self]:
            recorder.deliver(message)

    def deliver(self, message: dict[str, Any]) -> None:
        if self.observer is not None:
            self.observer.message(message)

    def ranks(self) -> list[RankInfo]:
        return []

    def note(self, message: str) -> None:
        self.notes.append(message)

    def set_state(self, state: str, **fields: object) -> None:
        self.states.append((state, fields))

    def stop(self, reason: str, exit_code: int) -> None:
        self.stops.append((reason, exit_code))


RANK = RankInfo(rank=9, local_rank=1, node=1, host="gpu-b", pid=4242)


def proof(expected: Expectation, environ: dict[str, str] | None = None,
          peers: list[Recorder] | None = None) -> tuple[TransportProof, Recorder]:
    observer = TransportProof(expected, {"MLENV_NUM_NODES": "2", **(environ or {})})
    control = Recorder(observer=observer)
    if peers is not None:
        peers.append(control)
        control.peers = peers
    observer.started(control)
    return observer, control


def test_the_verdict_is_printed_as_soon_as_nccl_names_its_network_and_refined_by_the_channels() -> None:
    observer, control = proof(Expectation("rdma", explicit=True))
    for text in ("gpu-b:4242:4250 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
                 "gpu-b:4242:4250 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
                 "[3]mlx5_3:1/IB [RO]; OOB ib0:10.0.0.2<0>",
                 "gpu-b:4242:4250 [1] NCCL INFO Using network IB"):
        observer.line(RANK, text)
    observer.tick(1.0)
    assert control.notes == ["node-1: RDMA (GDR not shown) via mlx5_0..3 (NET/IB, NCCL 2.21.5)"]
    observer.line(RANK, "gpu-b:4242:4251 [1] NCCL INFO Channel 00/0 : 1[1] -> 9[1] [receive] via NET/IB/1/GDRDMA")
    observer.tick(2.0)
    observer.tick(3.0)  # nothing new: nothing printed
    assert control.notes[1:] == ["node-1: RDMA+GDR via mlx5_0..3 (NET/IB, NCCL 2.21.5)"]
    assert control.states[-1] == ("running", {"transport": {
        "verdict": "RDMA+GDR", "plugin": "NET/IB", "devices": ["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/IB",
                                                               "mlx5_3:1/IB"], "nccl_version": "2.21.5+cuda12.4"}})
    assert observer.finished(0) == 0 and control.notes[-1] == "RDMA+GDR, as expected"
    assert control.stops == []


def test_a_contradiction_stops_the_job_with_the_evidence() -> None:
    observer, control = proof(Expectation("rdma", explicit=False))
    observer.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO NET/IB : No device found.")
    observer.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    observer.tick(1.0)
    ((reason, code),) = control.stops
    assert code == 1
    assert reason == ("NCCL uses SOCKETS but --expect-transport is rdma: NCCL chose NET/Socket "
                      "(evidence: rank9:1, rank9:2)")
    assert observer.finished(1) == 1  # said once


def test_sockets_expected_and_rdma_seen_is_a_contradiction_too() -> None:
    observer, control = proof(Expectation("sockets", explicit=True))
    observer.line(RANK, "h:4242:1 [0] NCCL INFO Channel 00/0 : 1[1] -> 9[1] [receive] via NET/AWS Libfabric/1/GDRDMA")
    observer.tick(1.0)
    assert control.stops and "NCCL uses RDMA+GDR but --expect-transport is sockets" in control.stops[0][0]


def test_a_single_node_job_used_no_network() -> None:
    observer, control = proof(Expectation("rdma", explicit=True), {"MLENV_NUM_NODES": "1"})
    observer.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    observer.tick(1.0)
    assert control.stops == []
    assert observer.finished(0) == 0
    assert control.notes[-1] == "INTRA-NODE: a single node, no network was used, nothing to prove"


def test_any_never_stops_and_keeps_the_exit_code() -> None:
    observer, control = proof(Expectation("any", explicit=True))
    observer.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    observer.tick(1.0)
    assert observer.finished(5) == 5 and control.stops == []
    assert control.notes == ["node-1: SOCKETS (NET/Socket): NCCL chose NET/Socket", "NCCL transport: SOCKETS"]


def test_expectation_defaults_and_debug_variables() -> None:
    assert expectation(None, {"MLENV_NETWORK_MODE": "rdma"}) == Expectation("rdma", explicit=False)
    assert expectation(None, {"MLENV_NETWORK_MODE": "tcp"}) == Expectation("any", explicit=False)
    assert expectation("sockets", {"MLENV_NETWORK_MODE": "rdma"}) == Expectation("sockets", explicit=True)
    rdma = Expectation("rdma", explicit=False)
    assert debug_env(rdma, {}) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert debug_env(rdma, {"NCCL_DEBUG": "WARN"}) == {}
    assert debug_env(rdma, {"NCCL_DEBUG_SUBSYS": "ALL"}) == {"NCCL_DEBUG": "INFO"}
    assert debug_env(Expectation("any", explicit=True), {}) == {}


def test_why_nothing_was_proven() -> None:
    empty = parse_nccl_log([])
    assert why_unproven({"NCCL_DEBUG_SUBSYS": "COLL"}, empty) == "NCCL_DEBUG_SUBSYS=COLL leaves out INIT and NET"
    assert why_unproven({}, empty) == "no NCCL lines in the output: the job may not use NCCL"


ECHOED = ["node1:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>",  # an old log, printed by the rank
          "node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
          "[default0]:node1:123:456 [0] NCCL INFO Using network Socket"]


def test_lines_echoed_by_a_rank_are_not_evidence() -> None:
    observer, control = proof(Expectation("rdma", explicit=False))
    for text in ECHOED:
        observer.line(RANK, text)
    observer.line(RANK, "print('gpu-b:4242:4250 [1] NCCL INFO Using network Socket')")  # not NCCL's shape
    observer.line(RANK, "rank 1: gpu-b:4242:4250 [1] NCCL INFO Using network Socket")  # nor this
    observer.tick(1.0)
    assert (control.stops, control.notes, control.states) == ([], [], [])
    assert observer.finished(0) == 0
    assert control.notes == ["warning: could not prove rdma: no NCCL lines in the output: the job may not use "
                             "NCCL; lines in NCCL's shape from node1:123 (no process of this job) are no evidence"]
    any_observer, any_control = proof(Expectation("any", explicit=True))
    for text in ECHOED:
        any_observer.line(RANK, text)
    any_observer.tick(1.0)
    assert any_observer.finished(0) == 0 and (any_control.notes, any_control.states) == ([], [])


def test_a_child_of_the_rank_is_of_the_job_and_an_unrelated_process_is_not(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        observer, control = proof(Expectation("rdma", explicit=True))
        observer.rank_started(RankInfo(rank=9, local_rank=1, node=1, host="gpu-b", pid=os.getpid()))
        observer.line(RANK, f"gpu-b:{child.pid}:1 [1] NCCL INFO Using network IB")
        stranger = RankInfo(rank=3, local_rank=0, node=1, host="gpu-b", pid=child.pid + 100000)
        observer.line(stranger, f"gpu-b:{os.getpid()}:1 [0] NCCL INFO Using network Socket")
        observer.tick(1.0)
        assert control.notes == ["node-1: RDMA (GDR not shown) (NET/IB)"] and control.stops == []
    finally:
        child.kill()
        child.wait()


def test_lines_before_the_rank_s_pid_are_read_once_it_is_known() -> None:
    observer, control = proof(Expectation("sockets", explicit=True))
    early = RankInfo(rank=9, local_rank=1, node=1, host="gpu-b", pid=0)
    observer.line(early, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    observer.tick(1.0)
    assert control.notes == []
    observer.rank_started(RANK)
    observer.tick(2.0)
    assert control.notes == ["node-1: SOCKETS (NET/Socket): NCCL chose NET/Socket"]


def test_the_hub_makes_one_verdict_for_the_run_and_every_node_judges_it() -> None:
    peers: list[Recorder] = []
    hub, hub_control = proof(Expectation("rdma", explicit=True), peers=peers)
    other, other_control = proof(Expectation("rdma", explicit=True), peers=peers)
    node0 = RankInfo(rank=0, local_rank=0, node=0, host="gpu-a", pid=77)
    hub.line(node0, "gpu-a:77:78 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA")
    hub.tick(1.0)
    other.tick(1.0)  # node-1's ranks printed nothing
    assert hub.finished(0) == 0 and other.finished(0) == 0
    assert hub_control.notes[-1] == other_control.notes[-1] == "RDMA+GDR, as expected"


def test_a_contradiction_on_another_node_is_stopped_by_the_hub_and_no_node_says_otherwise() -> None:
    peers: list[Recorder] = []
    hub, hub_control = proof(Expectation("rdma", explicit=True), peers=peers)
    other, other_control = proof(Expectation("rdma", explicit=True), peers=peers)
    other.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    other.tick(1.0)
    assert other_control.stops == [] and len(hub_control.stops) == 1
    assert hub_control.stops[0][0] == ("NCCL uses SOCKETS but --expect-transport is rdma: NCCL chose NET/Socket "
                                       "(evidence: rank9:1)")
    assert hub.finished(1) == 1 and other.finished(1) == 1
    assert not any("could not prove" in note for note in hub_control.notes + other_control.notes)


def test_the_hub_says_its_own_verdict_before_a_peer_s_contradiction_stops_the_job() -> None:
    peers: list[Recorder] = []
    hub, hub_control = proof(Expectation("rdma", explicit=True), peers=peers)
    other, _ = proof(Expectation("rdma", explicit=True), peers=peers)
    hub.line(RankInfo(rank=0, local_rank=0, node=0, host="gpu-a", pid=77), "gpu-a:77:78 [0] NCCL INFO Using network "
                                                                           "Socket")
    other.line(RANK, "gpu-b:4242:4250 [1] NCCL INFO Using network Socket")
    other.tick(1.0)  # before the hub's own tick
    assert hub_control.notes[0] == "node-0: SOCKETS (NET/Socket): NCCL chose NET/Socket"
    assert hub_control.notes[1].startswith("error: NCCL uses SOCKETS but --expect-transport is rdma")
    assert len(hub_control.stops) == 1
