#!/usr/bin/env python3
"""All-reduce bandwidth across message sizes, reported like nccl-tests.

algbw = bytes / time and busbw = algbw * 2(n-1)/n, the figure comparable to link speed.
Start it on every node through the runtime launcher (gloo on CPU, NCCL on GPUs); ``mlenv nccl-test`` does:

    python3 -m mlenv.runtime launch -- allreduce_bench.py --sizes 8M:1G

Sizes are ``--sizes MIN:MAX[:FACTOR]`` (doubling by default) or a list ``1M,64M,1G``, or nccl-tests' ``-b MIN
-e MAX -f FACTOR``. Rank 0 prints a table whose every line starts with ``allreduce`` (a header, then one line per
size: size_bytes time_us algbw_GBps busbw_GBps) and a final ``peak_busbw_gbps=... size_bytes=... world_size=...
backend=...`` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from mlenv.runtime.sizes import parse_sizes

DEFAULT_SIZES = {True: ("1M", "1G", 4), False: ("4K", "4M", 4)}
"""MIN, MAX, FACTOR by device: on GPUs up to 1G, where NCCL's bus bandwidth levels off; on CPU (gloo) small."""


def say(line: str) -> None:
    """Print one line in a single write, so lines of ranks sharing a pipe do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def sizes_argument(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(on_gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="all-reduce bus bandwidth across message sizes")
    low, high, factor = DEFAULT_SIZES[on_gpu]
    parser.add_argument("--sizes", type=sizes_argument, help="MIN:MAX[:FACTOR] or A,B,C (wins over -b/-e/-f)")
    parser.add_argument("-b", "--min-bytes", default=low, help=f"smallest size (default {low})")
    parser.add_argument("-e", "--max-bytes", default=high, help=f"largest size (default {high})")
    parser.add_argument("-f", "--factor", type=int, default=factor, help=f"size multiplier (default {factor})")
    parser.add_argument("--iters", type=int, default=20 if on_gpu else 5, help="timed iterations per size")
    parser.add_argument("--warmup", type=int, default=5 if on_gpu else 1)
    parser.add_argument("--nccl-debug", metavar="LEVEL", help="set NCCL_DEBUG (INFO logs the transport NCCL uses)")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's launcher passes it
    args = parser.parse_args()
    if args.iters < 1 or args.warmup < 0:
        parser.error("need --iters >= 1 and --warmup >= 0")
    if args.sizes is None:
        try:
            args.sizes = parse_sizes(f"{args.min_bytes}:{args.max_bytes}:{args.factor}")
        except ValueError as exc:
            parser.error(str(exc))
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
    if args.nccl_debug:
        os.environ["NCCL_DEBUG"] = args.nccl_debug  # read by NCCL when the first communicator is made
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    if rank == 0:
        say(f"all-reduce float32 backend={backend} world_size={world}")
        say(f"allreduce {'size_bytes':>12} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    peak, peak_size = 0.0, 0
    for size in args.sizes:
        tensor = torch.empty(size // 4, dtype=torch.float32, device=device)
        check_sum(tensor)
        seconds = time_all_reduce(tensor, args.iters, args.warmup)
        algbw = size / seconds / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if busbw > peak:
            peak, peak_size = busbw, size
        if rank == 0:
            say(f"allreduce {size:>12} {seconds * 1e6:>12.1f} {algbw:>11.6f} {busbw:>11.6f}")
        del tensor
    if rank == 0:
        say(f"peak_busbw_gbps={peak:.6f} size_bytes={peak_size} world_size={world} backend={backend}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
