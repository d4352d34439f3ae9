"""Starts an example's ranks: under torchrun as they are, else as local processes (fork) joined
by a gloo default group over a file store. Also what the training examples share: their
common options, the timed training loop, the model and data, and the comparisons."""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def arguments(doc, width=512):
    """The options every training example takes; add its own, then parse_args()."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="local processes (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the step time")
    p.add_argument("--width", type=int, default=width, help="hidden width")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    return p


def mlp(args, inputs=64, outputs=10):
    """The examples' model, the same weights on every rank and in every run."""
    torch.manual_seed(0)
    layers = [nn.Linear(inputs, args.width), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.width, outputs))


def classification_batch(args, rank, step):
    """Rank `rank`'s samples of step `step` (different on every rank) and their labels."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(args.batch, 64, generator=g)
    return x, (x[:, :10] > 0).float().argmax(1)


def timed_steps(args, step):
    """Runs step(i) -> loss for every step; (losses, step times after the warm-up)."""
    losses, times = [], []
    for i in range(args.steps):
        start = time.perf_counter()
        loss = step(i)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, times


def run(main, args, ranks):
    """Calls main(rank, world_size, args) on every rank, inside a default gloo group."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("gloo")
        try:
            main(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_spawned, args=(ranks, os.path.join(tmp, "store"), main, args),
                           nprocs=ranks, start_method="fork" if sys.platform == "linux" else "spawn")


def _spawned(rank, world_size, store_path, main, args):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world_size)
    try:
        main(rank, world_size, args)
    finally:
        dist.destroy_process_group()


def slowest_median(times):
    """The job's step time: the median of each rank's step times, the slowest rank's."""
    mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return max(t.item() for t in every)


def largest_difference(a, b):
    """The largest absolute elementwise difference between two lists of tensors (or floats)."""
    return max((torch.as_tensor(x, dtype=torch.float64) - torch.as_tensor(y, dtype=torch.float64))
               .abs().max().item() for x, y in zip(a, b, strict=True))
