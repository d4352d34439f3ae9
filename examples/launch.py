"""Starts an example's ranks: under torchrun as they are, else as local processes (fork) joined
by a gloo default group over a file store. Also the few helpers the examples share."""
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


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
