"""Quick start: README's example, with its results checked, one process per rank on CPU.

    torchrun --nproc_per_node 4 examples/quickstart.py
"""
import torch
import torch.distributed as dist

import ringcomm  # registers the "ringcomm" backend


def main():
    dist.init_process_group("ringcomm")
    rank, n = dist.get_rank(), dist.get_world_size()

    t = torch.arange(8.0) + rank
    dist.all_reduce(t)  # the sum over ranks, identical bits on every rank
    assert torch.equal(t, torch.arange(8.0) * n + sum(range(n)))

    comm = ringcomm.Communicator(timeout=60)  # the library itself, on the default group
    comm.all_reduce(t, op="max")
    out = torch.empty(n * 8)
    comm.all_gather(out, t + rank)
    assert torch.equal(out.view(n, 8), t + torch.arange(float(n)).view(n, 1))

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    model.register_comm_hook(comm, ringcomm.ddp.allreduce_hook)
    model(torch.full((4, 8), float(rank))).sum().backward()  # gradients averaged over ranks
    assert torch.equal(model.module.weight.grad, torch.full((8, 8), 4.0 * (n - 1) / 2))
    if rank == 0:
        print(f"all_reduce over {n} ranks: {t.tolist()}")
        print(f"weight gradient, averaged: {model.module.weight.grad[0, :4].tolist()}")
        print(ringcomm.schedule("all_reduce", world_size=n, count=8))
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
