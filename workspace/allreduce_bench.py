#!/usr/bin/env python3
"""All-reduce bandwidth across message sizes, reported like nccl-tests.

algbw = bytes / time and busbw = algbw * 2(n-1)/n, the figure comparable to link speed.
Start it on every node through the runtime launcher (gloo on CPU, NCCL on GPUs):

    python3 -m mlenv.runtime launch -- allreduce_bench.py --max-bytes 1G

Rank 0 prints one line per size and a final ``peak_busbw_gbps=... size_bytes=... world_size=...`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """Print one line in a single write, so lines of ranks sharing a pipe do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``16M``, ``1G`` -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    suffix = text[-1:].upper()
    return int(text[:-1]) * units[suffix] if suffix in units else int(text)


def parse_args(on_gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="all-reduce bus bandwidth across message sizes")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("4K"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("256M" if on_gpu else "4M"))
    parser.add_argument("--factor", type=int, default=4, help="size multiplier between steps")
    parser.add_argument("--iters", type=int, default=20 if on_gpu else 5, help="timed iterations per size")
    parser.add_argument("--warmup", type=int, default=5 if on_gpu else 1)
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's launcher passes it
    args = parser.parse_args()
    if args.factor < 2 or args.min_bytes < 4 or args.iters < 1:
        parser.error("need --factor >= 2, --min-bytes >= 4 and --iters >= 1")
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all_reduce(tensor: torch.Tensor, iters: int, warmup: int) -> float:
    """Seconds per all-reduce, the slowest rank's (what the collective costs everyone)."""
    world = dist.get_world_size()
    for _ in range(warmup):
        dist.all_reduce(tensor)
    synchronize(tensor.device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        tensor.fill_(1.0 / world)  # sums stay at 1.0, far from overflow
        dist.all_reduce(tensor)
    synchronize(tensor.device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], device=tensor.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def check_sum(tensor: torch.Tensor) -> None:
    """All-reduce of ones must give the world size everywhere."""
    tensor.fill_(1.0)
    dist.all_reduce(tensor)
    if not torch.all(tensor == dist.get_world_size()):
        raise SystemExit(f"rank {dist.get_rank()}: all-reduce returned a wrong sum")


def main() -> None:
    on_gpu = torch.cuda.is_available()
    args = parse_args(on_gpu)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        say(f"all-reduce float32 backend={dist.get_backend()} world_size={world}")
        say(f"{'size_bytes':>12} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    peak, peak_size, size = 0.0, 0, args.min_bytes
    while size <= args.max_bytes:
        tensor = torch.empty(size // 4, dtype=torch.float32, device=device)
        check_sum(tensor)
        seconds = time_all_reduce(tensor, args.iters, args.warmup)
        algbw = size / seconds / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if busbw > peak:
            peak, peak_size = busbw, size
        if rank == 0:
            say(f"{size:>12} {seconds * 1e6:>12.1f} {algbw:>11.3f} {busbw:>11.3f}")
        size *= args.factor
    if rank == 0:
        say(f"peak_busbw_gbps={peak:.3f} size_bytes={peak_size} world_size={world} "
            f"backend={dist.get_backend()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
