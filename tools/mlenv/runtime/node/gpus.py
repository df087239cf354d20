"""GPU state of this node, as ``status --gpus``, ``top`` and the idle-GPU check read it: per GPU utilisation,
memory, temperature and power (``nvidia-smi --query-gpu``), ECC counters and retired pages (``nvidia-smi -q -d
ECC,PAGE_RETIREMENT``), Xid events from the kernel log since the run started, and the job's ranks with their CPU,
RSS and the age of their last output (any bytes: the supervisor's ``ranks.json``).

One reader, :func:`read_node`; every source takes its root or program as an argument so tests feed stand-ins.
A source that cannot be read is named in ``errors`` and the rest still answers.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path

from ..records.runlayout import NodeDir, RankRecord, read_ranks
from .readfs import read_text

QUERY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "utilization.gpu", "memory.used", "memory.total",
                "temperature.gpu", "power.draw")
"""What ``--query-gpu`` asks for, in this order (CSV, no header, no units)."""
SMI_TIMEOUT = 20.0
CPU_SAMPLE_SECONDS = 0.5
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)")


@dataclass(frozen=True)
class Ecc:
    """Volatile ECC counts (since the driver loaded or the GPU was reset) and retired pages of one GPU; None
    where the GPU reports N/A."""

    volatile_correctable: int | None = None
    volatile_uncorrectable: int | None = None
    retired_pages: int | None = None
    retirement_pending: bool | None = None


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi`` reports it; None for a figure it does not support."""

    index: int
    uuid: str
    name: str
    bus_id: str
    utilization: float | None
    """Percent."""
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None
    ecc: Ecc = field(default_factory=Ecc)


@dataclass(frozen=True)
class Xid:
    """One Xid event of the kernel log."""

    at: float
    """Seconds since the epoch."""
    bus_id: str
    code: int
    message: str
    gpu: int | None = None
    """The index of the GPU at ``bus_id``, where nvidia-smi listed it."""


@dataclass(frozen=True)
class RankUsage:
    """One rank of this node's job and what it uses."""

    rank: int
    local_rank: int
    pid: int
    state: str
    cpu_percent: float | None
    rss_mib: float | None
    last_output_age_s: float | None
    """Seconds since the rank last wrote anything, a whole line or not (None before it first did)."""


@dataclass(frozen=True)
class NodeGpus:
    """Everything :func:`read_node` found on this node."""

    host: str
    gpus: list[Gpu]
    xid: list[Xid] | None
    """None when the kernel log cannot be read."""
    since: float | None
    """Xid events are those after this time (the run's start; None: since boot)."""
    run_id: str | None
    ranks: list[RankUsage]
    errors: list[str]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _number(text: str) -> float | None:
    """A ``--query-gpu`` figure; None for ``[N/A]``, ``[Not Supported]`` and the like."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_query(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(row) != len(QUERY_FIELDS):
            continue
        values = dict(zip(QUERY_FIELDS, (cell.strip() for cell in row), strict=True))
        index = _number(values["index"])
        if index is None:
            continue
        gpus.append(Gpu(int(index), values["uuid"], values["name"], values["pci.bus_id"],
                        _number(values["utilization.gpu"]), _number(values["memory.used"]),
                        _number(values["memory.total"]), _number(values["temperature.gpu"]),
                        _number(values["power.draw"])))
    return gpus


def bus_key(text: str) -> str:
    """A PCI address as domain:bus:device (``0000:03:00``), to match nvidia-smi's ``00000000:03:00.0`` with the
    kernel's ``0000:03:00``."""
    parts = text.strip().lower().split(".")[0].split(":")
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}" if len(parts) == 3 else ":".join(parts)
    except ValueError:
        return ":".join(parts)


def _sections(text: str) -> Iterator[tuple[str, dict[tuple[str, ...], str]]]:
    """Each GPU block of ``nvidia-smi -q``: its bus id and its ``(section, ..., key) -> value`` lines."""
    bus: str | None = None
    values: dict[tuple[str, ...], str] = {}
    path: list[tuple[int, str]] = []
    for line in text.splitlines():
        if line.startswith("GPU "):
            if bus is not None:
                yield bus, values
            bus, values, path = bus_key(line[4:]), {}, []
            continue
        if bus is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(":")
        while path and path[-1][0] >= indent:
            path.pop()
        if colon and value.strip():
            values[(*(name for _, name in path), key.strip())] = value.strip()
        else:
            path.append((indent, key.strip()))
    if bus is not None:
        yield bus, values


def _count(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def parse_ecc(text: str) -> dict[str, Ecc]:
    """Bus key (:func:`bus_key`) -> ECC counts from ``nvidia-smi -q -d ECC,PAGE_RETIREMENT``: the ``SRAM``/``DRAM``
    counters of drivers since R510 and the ``Single Bit``/``Double Bit`` totals of older ones."""
    found = {}
    for bus, values in _sections(text):
        volatile = {path[2:]: value for path, value in values.items() if path[:2] == ("ECC Errors", "Volatile")}
        correctable = [_count(v) for k, v in volatile.items() if k == ("Single Bit", "Total")
                       or (k[-1].endswith("Correctable") and "Uncorrectable" not in k[-1])]
        uncorrectable = [_count(v) for k, v in volatile.items()
                         if "Uncorrectable" in k[-1] or k == ("Double Bit", "Total")]
        retired = [_count(values.get(("Retired Pages", f"{kind} Bit ECC"))) for kind in ("Single", "Double")]
        pending = values.get(("Retired Pages", "Pending Page Blacklist"))
        found[bus] = Ecc(_sum(correctable), _sum(uncorrectable), _sum(retired),
                         {"Yes": True, "No": False}.get(pending or ""))
    return found


def parse_kmsg(lines: Iterable[str], boot_time: float, since: float | None) -> list[Xid]:
    """Xid events of ``/dev/kmsg`` records (``PRI,SEQ,USEC,FLAGS;MESSAGE``) at or after ``since``."""
    events = []
    for line in lines:
        header, _, message = line.partition(";")
        match = _XID.search(message)
        fields = header.split(",")
        if match is None or len(fields) < 3 or not fields[2].isdigit():
            continue
        at = boot_time + int(fields[2]) / 1e6
        if since is None or at >= since:
            events.append(Xid(at, match.group(1), int(match.group(2)), match.group(3).strip()))
    return events


def read_kmsg(path: Path) -> list[str]:
    """Every record of the kernel log device (or of a file in its format), without blocking."""
    chunks = []
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(descriptor, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record overwritten while reading: go on with the next
                continue
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    return b"".join(chunks).decode(errors="replace").splitlines()


def boot_time(proc_root: Path) -> float | None:
    """When the machine booted (``btime`` of ``/proc/stat``)."""
    for line in (read_text(proc_root / "stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def _smi(nvidia_smi: str, args: Sequence[str]) -> str:
    """``nvidia-smi ARGS``'s output; OSError (named) when it cannot run or fails."""
    try:
        done = subprocess.run([nvidia_smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise OSError(f"{nvidia_smi} {args[0]} gave no answer within {SMI_TIMEOUT:g}s") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        raise OSError(f"{nvidia_smi} failed ({done.returncode}): {said[-1] if said else 'no output'}")
    return done.stdout


def read_gpus(nvidia_smi: str = "nvidia-smi") -> list[Gpu]:
    """Every GPU with its ECC counts; OSError when nvidia-smi is missing or fails."""
    gpus = parse_query(_smi(nvidia_smi, [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]))
    ecc = parse_ecc(_smi(nvidia_smi, ["-q", "-d", "ECC,PAGE_RETIREMENT"]))
    return [replace(gpu, ecc=ecc.get(bus_key(gpu.bus_id), Ecc())) for gpu in gpus]


def _iso(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else None
    except ValueError:
        return None


def _cpu_ticks(proc_root: Path, pid: int) -> int | None:
    """utime + stime of ``pid`` and its waited-for children, in clock ticks."""
    stat = read_text(proc_root / str(pid) / "stat")
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15]) if len(fields) > 14 else None


def _rss_mib(proc_root: Path, pid: int) -> float | None:
    for line in (read_text(proc_root / str(pid) / "status") or "").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def rank_usage(ranks: Sequence[RankRecord], proc_root: Path, now: float,
               sample: float = CPU_SAMPLE_SECONDS) -> list[RankUsage]:
    """CPU (over ``sample`` seconds), RSS and last-output age of the ranks of a ``ranks.json``."""
    pids = {rank.pid: rank for rank in ranks}
    before = {pid: _cpu_ticks(proc_root, pid) for pid in pids}
    started = time.monotonic()
    if any(value is not None for value in before.values()) and sample > 0:
        time.sleep(sample)
    elapsed = max(time.monotonic() - started, 1e-6)
    hertz = os.sysconf("SC_CLK_TCK")
    usage = []
    for pid, rank in pids.items():
        after, first = _cpu_ticks(proc_root, pid), before[pid]
        cpu = None if after is None or first is None else round(100 * (after - first) / hertz / elapsed, 1)
        last = _iso(rank.last_output_at)
        usage.append(RankUsage(rank.rank, rank.local_rank, pid, rank.state, cpu, _rss_mib(proc_root, pid),
                               None if last is None else round(max(0.0, now - last), 1)))
    return sorted(usage, key=lambda r: r.rank)


def read_node(host: str, *, run: NodeDir | None, nvidia_smi: str = "nvidia-smi",
              kmsg: Path = Path("/dev/kmsg"), proc_root: Path = Path("/proc"),
              now: float | None = None) -> NodeGpus:
    """This node's GPUs, Xid events since its share of ``run`` (a run's node directory) started, and its ranks."""
    now = time.time() if now is None else now
    errors = []
    gpus: list[Gpu] = []
    try:
        gpus = read_gpus(nvidia_smi)
    except FileNotFoundError:
        errors.append(f"GPUs: {nvidia_smi} not found")
    except OSError as err:
        errors.append(f"GPUs: {err.strerror or err}")
    ranks = read_ranks(run) if run else []
    starts = [t for t in (_iso(rank.started_at) for rank in ranks) if t is not None]
    since = min(starts) if starts else None
    xid: list[Xid] | None = None
    booted = boot_time(proc_root)
    try:
        if booted is None:
            raise OSError(f"no btime in {proc_root / 'stat'}")
        xid = parse_kmsg(read_kmsg(kmsg), booted, since)
    except OSError as err:
        errors.append(f"Xid events: cannot read {kmsg}: {err.strerror or err}")
    if xid is not None:
        index = {bus_key(gpu.bus_id): gpu.index for gpu in gpus}
        xid = [replace(event, gpu=index.get(bus_key(event.bus_id))) for event in xid]
    return NodeGpus(host, gpus, xid, since, run.run_dir.name if run else None, rank_usage(ranks, proc_root, now),
                    errors)


def _figure(value: object, unit: str, digits: int = 0) -> str:
    return "-" if value is None else f"{float(str(value)):.{digits}f}{unit}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def render_node(report: Mapping[str, object] | NodeGpus) -> str:
    """A node's report (:class:`NodeGpus` or its JSON form) as indented tables: GPUs, Xid events, ranks."""
    data: Mapping[str, object] = report.to_dict() if isinstance(report, NodeGpus) else report
    gpus, ranks, xid = (data.get(key) for key in ("gpus", "ranks", "xid"))
    lines = []
    if isinstance(gpus, list) and gpus:
        rows: list[tuple[str, ...]] = [("GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "ECC VOLATILE C/U",
                                        "RETIRED PAGES")]
        for gpu in gpus:
            ecc = gpu.get("ecc") or {}
            memory = (f"{_figure(gpu['memory_used_mib'], '')}/{_figure(gpu['memory_total_mib'], ' MiB')}"
                      if gpu.get("memory_total_mib") is not None else "-")
            counts = [ecc.get("volatile_correctable"), ecc.get("volatile_uncorrectable")]
            retired = ecc.get("retired_pages")
            rows.append((str(gpu["index"]), str(gpu["name"]), _figure(gpu["utilization"], "%"), memory,
                         _figure(gpu["temperature_c"], "C"), _figure(gpu["power_w"], " W", 1),
                         "/".join("-" if c is None else str(c) for c in counts),
                         ("-" if retired is None else str(retired))
                         + (" (pending)" if ecc.get("retirement_pending") else "")))
        lines += _columns(rows)
    since = "since the run started" if data.get("since") else "since boot"
    if isinstance(xid, list):
        lines += [f"  Xid events {since}: {'none' if not xid else len(xid)}"]
        lines += [f"    {datetime.fromtimestamp(float(e['at'])).astimezone().isoformat(timespec='seconds')} "
                  f"GPU {'?' if e.get('gpu') is None else e['gpu']} ({e['bus_id']}): Xid {e['code']}: {e['message']}"
                  for e in xid]
    if isinstance(ranks, list) and ranks:
        rows = [("RANK", "LOCAL", "PID", "STATE", "CPU", "RSS", "LAST OUTPUT")]
        rows += [(str(r["rank"]), str(r["local_rank"]), str(r["pid"]), str(r["state"]),
                  _figure(r["cpu_percent"], "%", 1), _figure(r["rss_mib"], " MiB"),
                  "never" if r["last_output_age_s"] is None else f"{r['last_output_age_s']:.0f} s ago")
                 for r in ranks]
        lines += _columns(rows)
    elif data.get("run_id") is None:
        lines.append("  no run of mlenv's on this node")
    errors = data.get("errors")
    lines += [f"  {error}" for error in errors] if isinstance(errors, list) else []
    return "\n".join(lines)
