"""The runtime's GPU reader against the nvidia-smi stand-in (real CLI formats), a kernel log in /dev/kmsg's record
format, a procfs ``stat`` and a real rank process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from mlenv.runtime.node.gpus import Ecc, bus_key, parse_ecc, parse_query, read_node, render_node
from mlenv.runtime.records.runlayout import NodeDir
from runtime_support import FIXTURES, Runner

STANDIN = FIXTURES / "nvidia_smi"
BOOT = 1_764_000_000.0


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat()


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH, answering for a busy GPU with ECC errors and an unsupported power figure."""
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps([
        {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:18:00.0",
         "utilization": 97, "memory_used": 71234, "memory_total": 81559, "temperature": 64, "power": None,
         "ecc": {"volatile": {"DRAM Correctable": 5, "DRAM Uncorrectable": 2, "SRAM Uncorrectable Parity": 1},
                 "retired": {"single": 3, "double": 1, "pending": "Yes"}}},
        {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:2A:00.0",
         "utilization": 0, "memory_used": 1, "memory_total": 81559, "temperature": 30, "power": 68.5,
         "ecc": {"enabled": False}},
    ]))
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_STANDIN", str(state))
    return state


@pytest.fixture
def rank_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for a training rank: it burns CPU and holds some memory."""
    process = subprocess.Popen([sys.executable, "-c", "x = bytearray(64 << 20)\nwhile True: pass"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _proc(tmp_path: Path) -> Path:
    """A procfs root whose ``stat`` says the machine booted at BOOT, with the real /proc's processes."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {int(BOOT)}\nprocesses 9\n")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            (root / entry.name).symlink_to(entry)
    return root


def _node_dir(root: Path, run: str, node: int, host: str, ranks: list[dict[str, object]]) -> NodeDir:
    """A node's directory of ``run`` as the supervisor leaves it: its record and its ranks.json."""
    found = NodeDir(root / run, 0, node)
    found.path.mkdir(parents=True)
    found.record.write_text(json.dumps({"run_id": run, "node_rank": node, "host": host, "pid": 1, "start_ticks": 1,
                                        "started_at": _iso(BOOT), "argv": ["x"], "attempt": 0}))
    records = [{"node": node, "host": host, "exit_code": None, "signal": None, "ended_at": None, "state": "running",
                "local_rank": 0, "last_output_at": None, "started_at": _iso(BOOT), **rank} for rank in ranks]
    found.ranks.write_text(json.dumps(records))
    return found


def _kmsg(tmp_path: Path, records: list[tuple[float, str]]) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("".join(f"4,{n},{int((at - BOOT) * 1e6)},-;{text}\n" for n, (at, text) in enumerate(records)))
    return path


def test_query_csv_of_the_real_cli_with_unsupported_figures(standin: Path) -> None:
    fields = "index,uuid,name,pci.bus_id,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
    text = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True).stdout
    assert text.splitlines()[0] == "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 97, 71234, 81559, 64, [N/A]"
    gpus = parse_query(text)
    assert [(g.index, g.utilization, g.memory_used_mib, g.power_w) for g in gpus] == [(0, 97, 71234, None),
                                                                                     (1, 0, 1, 68.5)]


def test_ecc_of_r550_and_of_r470_layouts(standin: Path) -> None:
    text = subprocess.run(["nvidia-smi", "-q", "-d", "ECC,PAGE_RETIREMENT"], capture_output=True, text=True,
                          check=True).stdout
    found = parse_ecc(text)
    assert found == {"0000:18:00": Ecc(5, 3, 4, True), "0000:2a:00": Ecc(None, None, None, None)}
    old = parse_ecc((STANDIN / "q_ecc_r470.txt").read_text())
    assert old == {"0000:3b:00": Ecc(3, 1, 3, True)}  # the Totals, not Total + Device Memory


def test_bus_ids_of_nvidia_smi_and_the_kernel_match() -> None:
    assert bus_key("00000000:2A:00.0") == bus_key("0000:2a:00") == "0000:2a:00"


def test_node_report_gpus_xid_since_the_run_and_ranks(standin: Path, tmp_path: Path,
                                                      rank_process: subprocess.Popen[bytes]) -> None:
    started = BOOT + 1000
    kmsg = _kmsg(tmp_path, [
        (started - 10, "NVRM: Xid (PCI:0000:18:00): 13, pid=11, name=python3, Graphics Exception"),  # before
        (started + 5, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module"),
        (started + 20, "NVRM: Xid (PCI:0000:2a:00): 79, pid=4242, name=python3, GPU has fallen off the bus."),
    ])
    run = _node_dir(tmp_path / "runs", "r1", 0, "h", [{"rank": 2, "pid": rank_process.pid, "started_at": _iso(started),
                                                        "last_output_at": _iso(time.time() - 42)}])
    report = read_node("h", run=run, kmsg=kmsg, proc_root=_proc(tmp_path))
    assert report.errors == [] and report.run_id == "r1" and report.since == started
    assert [(x.gpu, x.code, x.message) for x in report.xid or []] == [(1, 79, "pid=4242, name=python3, GPU has "
                                                                              "fallen off the bus.")]
    (rank,) = report.ranks
    assert rank.rank == 2 and rank.pid == rank_process.pid and rank.state == "running"
    assert rank.rss_mib is not None and rank.rss_mib > 64
    assert rank.cpu_percent is not None and rank.cpu_percent > 10
    assert rank.last_output_age_s is not None and 40 <= rank.last_output_age_s < 100
    text = render_node(report)
    assert "GPU 1 (0000:2a:00): Xid 79" in text and "97%" in text and "4 (pending)" in text


def test_unreadable_sources_are_named_and_the_rest_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          standin: Path) -> None:
    monkeypatch.setenv("NVIDIA_SMI_STANDIN_FAIL", "1")
    report = read_node("h", run=None, kmsg=tmp_path / "missing", proc_root=_proc(tmp_path))
    assert report.gpus == [] and report.xid is None
    assert report.errors[0].startswith("GPUs: ") and "couldn't communicate with the NVIDIA driver" in report.errors[0]
    assert report.errors[1].startswith(f"Xid events: cannot read {tmp_path / 'missing'}")


def test_runtime_gpus_command_finds_this_nodes_latest_run(run_runtime: Runner, standin: Path,
                                                         tmp_path: Path) -> None:
    records = (("old", 1, "here"), ("new", 1, "here"), ("new", 0, "here"), ("other", 1, "there"))
    for order, (run, node, host) in enumerate(records):  # "other" (another host's) started last, then "new"
        found = _node_dir(tmp_path / "runs", run, node, host, [{"rank": node, "pid": 1}])
        record = json.loads(found.record.read_text())
        found.record.write_text(json.dumps({**record, "started_at": _iso(BOOT + order)}))
    env = {"MLENV_RUNS_ROOT": str(tmp_path / "runs"), "MLENV_NODE_RANK": "1", "HOSTNAME": "here",
           "PATH": os.environ["PATH"], "NVIDIA_SMI_STANDIN": str(standin)}
    proc, kmsg = _proc(tmp_path), _kmsg(tmp_path, [])
    done = run_runtime("gpus", "--json", "--kmsg", str(kmsg), "--proc-root", str(proc), env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["run_id"] == "new" and [r["rank"] for r in report["ranks"]] == [1]
    assert [g["uuid"] for g in report["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    text = run_runtime("gpus", "--kmsg", str(kmsg), "--proc-root", str(proc), env=env)
    assert "NVIDIA H100 80GB HBM3" in text.stdout and "RANK" in text.stdout


def test_a_node_without_nvidia_smi_says_so_where_it_is_found_missing(tmp_path: Path) -> None:
    report = read_node("h", run=None, nvidia_smi=str(tmp_path / "nvidia-smi"), kmsg=tmp_path / "missing",
                       proc_root=_proc(tmp_path))
    assert report.gpus == [] and report.errors[0] == f"GPUs: {tmp_path / 'nvidia-smi'} not found"
