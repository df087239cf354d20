#!/usr/bin/env python3
"""All-reduce bandwidth across message sizes, reported like nccl-tests.

algbw = bytes / time and busbw = algbw * 2(n-1)/n, the figure comparable to link speed.
Start it on every node through the runtime launcher (gloo on CPU, NCCL on GPUs); ``mlenv nccl-test`` does:

    python3 -m mlenv.runtime launch -- allreduce_bench.py --sizes 8M:1G

Sizes are ``--sizes MIN:MAX[:FACTOR]`` (doubling by default) or a list ``1M,64M,1G``, or nccl-tests' ``-b MIN
-e MAX -f FACTOR``. Rank 0 prints a table whose every line starts with ``allreduce`` (a header, then one line per
size: size_bytes time_us algbw_GBps busbw_GBps) and a final ``peak_busbw_gbps=... size_bytes=... world_size=...
backend=...`` line.

With ``--pairs`` it bisects the fabric instead: in rounds (mlenv.runtime.fabric.pairs) the nodes form disjoint pairs
that all-reduce the largest size at once, each within its pair (timed by its fastest iteration), and the lowest rank of
every pair prints ``pair round=R nodes=A,B size_bytes=S time_us=T busbw_GBps=B`` (``mlenv nccl-test --pairs``
judges them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from mlenv.runtime.fabric.pairs import rounds
from mlenv.runtime.fabric.sizes import parse_sizes

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
    parser.add_argument("--pairs", action="store_true", help="all-reduce within node pairs, in rotating rounds")
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


def time_all_reduce(tensor: torch.Tensor, iters: int, warmup: int, group: Any = None, best: bool = False) -> float:
    """Seconds per all-reduce within ``group`` (default: everyone), the slowest rank's (what the collective costs
    everyone): the mean of the iterations, or with ``best`` the fastest one (what the link can do, without the
    moments another process had the CPU; a slow link is slow in every iteration)."""
    world = dist.get_world_size(group)
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    synchronize(tensor.device)
    dist.barrier(group=group)
    times = []
    start = time.perf_counter()
    for _ in range(iters):
        tensor.fill_(1.0 / world)  # sums stay at 1.0, far from overflow
        dist.all_reduce(tensor, group=group)
        if best:
            synchronize(tensor.device)
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
    synchronize(tensor.device)
    seconds = min(times) if best else (time.perf_counter() - start) / iters
    elapsed = torch.tensor([seconds], device=tensor.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def check_sum(tensor: torch.Tensor, group: Any = None) -> None:
    """All-reduce of ones must give the group's size everywhere."""
    tensor.fill_(1.0)
    dist.all_reduce(tensor, group=group)
    if not torch.all(tensor == dist.get_world_size(group)):
        raise SystemExit(f"rank {dist.get_rank()}: all-reduce returned a wrong sum")


def bus_bandwidth(size: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of ``size`` bytes among ``world`` ranks."""
    algbw = size / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def bench_pairs(args: argparse.Namespace, device: torch.device) -> None:
    """Every round's node pairs all-reduce the largest size at once, each within its pair."""
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, int(os.environ["MLENV_NODE_RANK"]))
    size, mine = max(args.sizes), nodes[dist.get_rank()]
    for number, pairs in enumerate(rounds(max(nodes) + 1)):
        groups = {pair: dist.new_group([r for r, node in enumerate(nodes) if node in pair]) for pair in pairs}
        for pair, group in groups.items():
            if mine not in pair:
                continue
            tensor = torch.empty(size // 4, dtype=torch.float32, device=device)
            check_sum(tensor, group)
            seconds = time_all_reduce(tensor, args.iters, args.warmup, group, best=True)
            members = [r for r, node in enumerate(nodes) if node in pair]
            if dist.get_rank() == members[0]:
                busbw = bus_bandwidth(size, seconds, len(members))[1]
                say(f"pair round={number} nodes={pair[0]},{pair[1]} size_bytes={size} time_us={seconds * 1e6:.1f} "
                    f"busbw_GBps={busbw:.6f}")
        dist.barrier()


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
    if args.pairs:
        bench_pairs(args, device)
        dist.destroy_process_group()
        return
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    if rank == 0:
        say(f"all-reduce float32 backend={backend} world_size={world}")
        say(f"allreduce {'size_bytes':>12} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    peak, peak_size = 0.0, 0
    for size in args.sizes:
        tensor = torch.empty(size // 4, dtype=torch.float32, device=device)
        check_sum(tensor)
        seconds = time_all_reduce(tensor, args.iters, args.warmup)
        algbw, busbw = bus_bandwidth(size, seconds, world)
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
