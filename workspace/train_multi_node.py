#!/usr/bin/env python3
"""Multi-node training example: DeepSpeed ZeRO-2 (or plain DDP) on synthetic regression data.

Start it on every node through the runtime launcher, which sets RANK, LOCAL_RANK and WORLD_SIZE:

    python3 -m mlenv.runtime launch --launcher deepspeed -- train_multi_node.py --steps 100
    ./launch_deepspeed.sh train_multi_node.py

The same file runs on CPU (gloo) and on GPUs (NCCL). Rank 0 prints ``step N/M loss X`` lines and
a final ``done steps=... first_loss=... last_loss=... world_size=...`` line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # before the process group exists: see main()
from torch.nn.parallel import DistributedDataParallel

FEATURES = 32
Step = Callable[[torch.Tensor], None]
End = Callable[[], None]
Engine = tuple[torch.nn.Module, Step, str, End]  # model to call, optimizer step, description, how it ends


def say(line: str) -> None:
    """Print one line in a single write, so lines of ranks sharing a pipe do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    """Command line; DeepSpeed's launcher adds --local_rank, which LOCAL_RANK makes redundant."""
    parser = argparse.ArgumentParser(description="DeepSpeed ZeRO-2 / DDP example on synthetic data")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default: %(default)s)")
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    parser.add_argument("--engine", choices=["deepspeed", "ddp"], default="deepspeed",
                        help="ddp runs in images without DeepSpeed (default: %(default)s)")
    parser.add_argument("--deepspeed_config", "--deepspeed-config", type=Path,
                        default=Path(__file__).with_name("ds_config.json"),
                        help="batch size, optimizer and ZeRO settings, for both engines")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # from DeepSpeed; LOCAL_RANK rules
    return parser.parse_args()


def pick_device(local_rank: int) -> torch.device:
    """This process's GPU, or the CPU where there is none."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def deepspeed_engine(model: torch.nn.Module, config: dict) -> Engine:
    """DeepSpeed with the ds_config.json settings (ZeRO-2); it picks NCCL or gloo itself."""
    import deepspeed  # here, so that --engine ddp runs in images without DeepSpeed

    deepspeed.init_distributed()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def step(loss: torch.Tensor) -> None:
        engine.backward(loss)
        engine.step()

    engine_ref = weakref.ref(engine)  # a strong one here would keep the engine, and its groups, to the end

    def end() -> None:
        alive = engine_ref()  # kept alive by the hooks it put on the model, until destroy() removes them
        if alive is not None:
            alive.destroy()
        del alive
        gc.collect()  # the unhooked engine is a plain reference cycle: free it, and its hold on the groups
        deepspeed.comm.destroy_process_group()  # ends the groups, and forgets those DeepSpeed keeps

    return engine, step, f"deepspeed zero_stage={engine.zero_optimization_stage()}", end


def ddp_engine(model: torch.nn.Module, config: dict, device: torch.device) -> Engine:
    """Plain DistributedDataParallel with AdamW at the ds_config.json learning rate."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    device_ids = [device.index] if device.type == "cuda" else None
    wrapped = DistributedDataParallel(model.to(device), device_ids=device_ids)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=config["optimizer"]["params"]["lr"])

    def step(loss: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return wrapped, step, "ddp", dist.destroy_process_group


def mean_over_ranks(value: torch.Tensor) -> float:
    """Average of a scalar over all ranks; every rank must call it at the same step."""
    total = value.detach().reshape(1).clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def train(args: argparse.Namespace) -> End:
    """Train a linear model on y = x @ w + noise; each rank draws its own samples. Returns how the engine
    ends its process groups."""
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    config = json.loads(args.deepspeed_config.read_text())
    device = pick_device(local_rank)
    torch.manual_seed(0)  # same initial model and target on every rank
    true_weights = torch.randn(FEATURES, 1) / FEATURES**0.5
    model = torch.nn.Linear(FEATURES, 1)
    if args.engine == "deepspeed":
        model, step, engine, end = deepspeed_engine(model, config)
    else:
        model, step, engine, end = ddp_engine(model, config, device)
    host = socket.gethostname()
    say(f"rank {rank}/{world_size} local_rank {local_rank} on {host} device {device}")
    if rank == 0:
        say(f"engine {engine} backend {dist.get_backend()} world_size {world_size}")

    data = torch.Generator().manual_seed(1000 + rank)  # each rank draws its own samples
    batch = config["train_micro_batch_size_per_gpu"]
    first_loss = last_loss = float("nan")
    for n in range(1, args.steps + 1):
        x = torch.randn(batch, FEATURES, generator=data)
        y = x @ true_weights + 0.01 * torch.randn(batch, 1, generator=data)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        step(loss)
        if n in (1, args.steps) or n % args.log_every == 0:
            last_loss = mean_over_ranks(loss)
            first_loss = last_loss if n == 1 else first_loss
            if rank == 0:
                say(f"step {n}/{args.steps} loss {last_loss:.4f}")
    if rank == 0:
        say(f"done steps={args.steps} first_loss={first_loss:.4f} last_loss={last_loss:.4f} "
            f"world_size={world_size}")
    return end


def main() -> None:
    """Train, then end the process groups once nothing else holds them.

    A group's gloo worker threads must end before the interpreter does: one still releasing a tensor once
    exit has begun aborts the process ("terminate called without an active exception"). So the model, which
    holds the groups, goes first (DDP's when train() returns, DeepSpeed's in its end()), and destroying the
    groups then drops the last hold, which joins their threads. In the other order, the model would end a
    group under the interpreter lock its threads may be waiting for. torch.distributed.nn is imported first
    because, imported once a group exists (as DDP does through torch._dynamo), it binds the group into its
    functions' defaults for good.
    """
    end = train(parse_args())
    end()


if __name__ == "__main__":
    main()
