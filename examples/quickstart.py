"""Quick start: an allreduce over ringcomm's ring on CPU, one process per rank.

    torchrun --nproc_per_node 4 examples/quickstart.py
"""
import torch
import torch.distributed as dist

import ringcomm


def main():
    dist.init_process_group("gloo")  # ringcomm takes rank, world size and the store from it
    comm = ringcomm.Communicator()
    rank, n = comm.rank, comm.world_size

    t = torch.arange(8, dtype=torch.float32) + 100 * rank
    comm.all_reduce(t)  # in place: the sum over ranks, identical bits on every rank
    expected = torch.arange(8, dtype=torch.float32) * n + 100 * sum(range(n))
    assert torch.equal(t, expected)

    out = torch.empty(n * 2)
    comm.all_gather(out, torch.full((2,), float(rank)))
    if rank == 0:
        print(f"all_reduce over {n} ranks: {t.tolist()}")
        print(f"all_gather: {out.tolist()}")
        print(ringcomm.schedule("all_reduce", world_size=n, count=8))
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
