"""The live transport proof as the supervisor drives it: lines, ticks, the end of the job. A recording JobControl
stands for the supervisor (the observer is what is tested; test_runtime_launcher runs it under the real one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlenv.runtime.ncclog import parse_nccl_log
from mlenv.runtime.observers import RankInfo
from mlenv.runtime.transport import Expectation, TransportProof, debug_env, expectation, why_unproven


@dataclass
class Recorder:
    """What the observer asked of the job."""

    run_dir: Path = Path("/nonexistent")
    notes: list[str] = field(default_factory=list)
    states: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    stops: list[tuple[str, int]] = field(default_factory=list)

    def ranks(self) -> list[RankInfo]:
        return []

    def note(self, message: str) -> None:
        self.notes.append(message)

    def set_state(self, state: str, **fields: object) -> None:
        self.states.append((state, fields))

    def stop(self, reason: str, exit_code: int) -> None:
        self.stops.append((reason, exit_code))


RANK = RankInfo(rank=9, local_rank=1, node=1, host="gpu-b", pid=4242)


def proof(expected: Expectation, environ: dict[str, str] | None = None) -> tuple[TransportProof, Recorder]:
    observer = TransportProof(expected, {"MLENV_NUM_NODES": "2", **(environ or {})})
    control = Recorder()
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
    observer.line(RANK, "h:1:1 [0] NCCL INFO Channel 00/0 : 1[1] -> 9[1] [receive] via NET/AWS Libfabric/1/GDRDMA")
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
