"""The idle-GPU watch: one node's judgement from samples at given times, the hub's decision for the whole job across
two nodes' observers (their messages relayed as the control channel relays them), and the sampler reading the
nvidia-smi stand-in. A recording JobControl stands for each node's supervisor (the observer is what is tested;
tests/integration/test_idle.py runs it under the real one)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mlenv.runtime.node.gpus import Gpu, read_gpus
from mlenv.runtime.watch.idle import IDLE_EXIT_CODE, Idleness, IdleWatch, Sample, Sampler, sample_interval, visible
from mlenv.runtime.watch.protocol import RankInfo
from runtime_support import FIXTURES, Runner

STANDIN = FIXTURES / "nvidia_smi"


def under(at: float, *utilization: float | None) -> Sample:
    return Sample(at, tuple(enumerate(utilization)))


def test_a_node_is_idle_once_every_gpu_stayed_under_the_threshold_for_the_window() -> None:
    judge = Idleness(threshold=5, window=3)
    assert [judge.add(under(t, 0, 4.9)) for t in (10, 11, 12)] == [False, False, False] and not judge.idle
    assert judge.add(under(13, 1, 0)) and judge.idle  # 3 s of samples under 5 %
    assert not judge.add(under(20, 0, 0)) and judge.idle
    assert judge.add(under(21, 0, 5)) and not judge.idle  # one GPU at the threshold is not under it
    assert [judge.add(under(t, 0, 0)) for t in (22, 24, 25)] == [False, False, True]  # the window starts again


def test_a_sample_that_proves_nothing_is_not_idle() -> None:
    judge = Idleness(threshold=5, window=2)
    for at in (0, 1, 2):
        judge.add(under(at, 0, None))  # one GPU's utilization N/A
    assert not judge.idle
    judge.add(under(3, 0, 0))
    judge.add(Sample(4, error="nvidia-smi failed (9): couldn't communicate with the NVIDIA driver"))
    judge.add(under(5, 0, 0))
    assert not judge.idle and judge.since == 5


def test_samples_come_six_to_a_window_at_most_one_a_second_at_least_one_every_10_s() -> None:
    assert (sample_interval(3), sample_interval(30), sample_interval(1800)) == (1.0, 5.0, 10.0)


def _gpu(index: int, uuid: str) -> Gpu:
    return Gpu(index, uuid, "NVIDIA H100 80GB HBM3", f"00000000:{index:02X}:00.0", 0, 1, 81559, 30, 70)


def test_the_gpus_of_the_run_are_those_of_cuda_visible_devices() -> None:
    gpus = [_gpu(0, "GPU-aaaa"), _gpu(1, "GPU-bbbb"), _gpu(2, "GPU-cccc")]
    assert [g.index for g in visible(gpus, {})] == [0, 1, 2]
    assert [g.index for g in visible(gpus, {"CUDA_VISIBLE_DEVICES": "2,0"})] == [0, 2]
    assert [g.index for g in visible(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"})] == [1]


@dataclass
class Node:
    """One node's supervisor as an observer sees it, joined to the others as the control channel joins them."""

    node: int
    num_nodes: int
    job: list[Node]
    run_dir: Path = Path("/nonexistent")
    notes: list[str] = field(default_factory=list)
    state: dict[str, object] = field(default_factory=dict)
    stops: list[tuple[str, int]] = field(default_factory=list)
    watch: IdleWatch | None = None

    @property
    def hub(self) -> bool:
        return self.node == 0

    def tell_hub(self, message: dict[str, Any]) -> None:
        self.job[0].deliver(message)

    def tell_all(self, message: dict[str, Any]) -> None:
        for node in self.job:
            node.deliver(message)

    def deliver(self, message: dict[str, Any]) -> None:
        assert self.watch is not None
        self.watch.message(message)

    def ranks(self) -> list[RankInfo]:
        return []

    def note(self, message: str) -> None:
        self.notes.append(message)

    def set_state(self, state: str, **fields: object) -> None:
        self.state.update(fields, state=state)

    def record(self, **fields: object) -> None:
        self.state.update(fields)

    def stop(self, reason: str, exit_code: int) -> None:
        self.stops.append((reason, exit_code))


def job(nodes: int, on_idle: str | None = None) -> list[Node]:
    """``nodes`` nodes, each with its watch started (5 %, 3 s); their samplers (no rank started) never run."""
    members: list[Node] = []
    for number in range(nodes):
        node = Node(number, nodes, members)
        node.watch = IdleWatch(5, 3, on_idle, Sampler(3600, {}, read=list), f"gpu-{'ab'[number]}")
        members.append(node)
        node.watch.started(node)
    return members


def feed(node: Node, *samples: Sample) -> None:
    assert node.watch is not None
    for sample in samples:
        node.watch.take(sample)


def idle_for(seconds: int, start: float = 100) -> list[Sample]:
    return [under(start + t, 0, 2) for t in range(seconds + 1)]


def test_the_job_is_idle_only_when_every_node_is_and_busy_again_clears_it() -> None:
    first, second = job(2)
    feed(second, *idle_for(3))
    assert not first.notes and not second.notes and "idle" not in second.state  # node 1 alone is not the job
    feed(first, *idle_for(4))
    assert first.notes == ["node-0 (gpu-a) idle: every GPU under 5% for 3 s (GPU 0 0%, GPU 1 2%); every GPU of the "
                           "job is idle"]
    assert second.notes == ["node-1 (gpu-b) idle: every GPU under 5% for 3 s (GPU 0 0%, GPU 1 2%); every GPU of the "
                            "job is idle"]
    report = second.state["idle"]
    assert isinstance(report, dict) and report["node"] == 1 and report["host"] == "gpu-b"
    assert report["threshold"] == 5 and report["seconds"] == 3 and "T" in str(report["since"])
    assert report["gpus"] == [{"index": 0, "utilization": 0}, {"index": 1, "utilization": 2}]
    assert first.stops == [] and second.stops == []  # warn: the default
    feed(second, under(110, 0, 60))
    assert second.notes[-1] == "node-1's GPUs are busy again: the job is no longer idle"
    assert len(first.notes) == 1  # the node that is busy says so
    assert first.state["idle"] is None and second.state["idle"] is None
    feed(second, *idle_for(3, start=120))
    assert first.state["idle"] is not None and second.state["idle"] is not None  # idle again, flagged again


def test_on_idle_stop_stops_the_job_with_its_own_exit_code() -> None:
    first, second = job(2, on_idle="stop")
    feed(first, *idle_for(5))
    feed(second, *idle_for(3))
    assert first.stops == [("idle: every GPU of the job under 5% for 3 s (--on-idle stop)", IDLE_EXIT_CODE)]
    assert second.stops == []  # node 0 decides for the job
    assert IDLE_EXIT_CODE not in (0, 1, 2, 124) and IDLE_EXIT_CODE < 128  # not a signal's 128+N
    assert first.watch is not None and first.watch.finished(IDLE_EXIT_CODE) == IDLE_EXIT_CODE
    assert first.state["idle"] is not None  # an idle stop keeps why
    assert second.watch is not None and second.watch.finished(0) == 0 and second.state["idle"] is None


def test_sampling_starts_with_the_nodes_first_rank() -> None:
    (only,) = job(1)
    assert only.watch is not None and only.watch.sampler.thread.ident is None  # the launcher is starting
    only.watch.rank_started(RankInfo(rank=0, local_rank=0, node=0, host="gpu-a", pid=os.getpid()))
    only.watch.rank_started(RankInfo(rank=1, local_rank=1, node=0, host="gpu-a", pid=os.getpid()))
    assert only.watch.sampler.thread.ident is not None
    only.watch.finished(0)
    only.watch.sampler.thread.join(timeout=30)
    assert not only.watch.sampler.thread.is_alive()


def test_gpus_that_cannot_be_read_are_named_once_and_never_idle() -> None:
    (only,) = job(1)
    failed = "nvidia-smi failed (9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
    feed(only, *[Sample(t, error=failed) for t in range(10)])
    assert only.notes == [f"idle GPUs not judged on node-0: {failed}"] and "idle" not in only.state


def test_the_sampler_reads_the_gpus_of_the_run_with_the_forensics_reader(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    utilization = tmp_path / "utilization"
    utilization.write_text("37\n")
    monkeypatch.setenv("NVIDIA_SMI_UTILIZATION_FILE", str(utilization))
    sampler = Sampler(0.2, {"CUDA_VISIBLE_DEVICES": "1"}, read=read_gpus)
    sampler.start()
    try:
        found: list[Sample] = []
        deadline = time.monotonic() + 60
        while len(found) < 2:
            assert time.monotonic() < deadline, found
            found += sampler.drain()
            time.sleep(0.05)
    finally:
        sampler.close()
    assert found[0].gpus == ((1, 37.0),) and found[0].error is None and found[1].at > found[0].at
    sampler.thread.join(timeout=30)
    assert not sampler.thread.is_alive()  # closed: no more samples


def test_bad_idle_options_exit_2_and_help_names_the_exit_code(run_runtime: Runner, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    for option in (["--idle-seconds", "0"], ["--idle-seconds", "3", "--idle-util", "101"],
                   ["--idle-seconds", "3", "--on-idle", "kill"]):
        result = run_runtime("launch", *option, "--", str(script))
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (option, result.stderr)
    assert f"exit code {IDLE_EXIT_CODE}" in run_runtime("launch", "--help").stdout
