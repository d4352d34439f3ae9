"""A rank may overwrite or free its buffers as soon as a call returns: no peer reads them after
that. Each rank scribbles over its buffers and frees them right after every call while its
peers are still at work, and every result is checked exactly. Real processes."""
import time

import pytest
import torch

from launcher import launch

COUNTS = [1, 1000, (1 << 18) + 3]  # one element, a few slices, many (not a multiple of any)


def scribbling(rank, n, algorithm):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60)
    wrong = 0
    for count in COUNTS:
        for round_ in range(4):
            value = float(rank + 1 + round_)
            t = torch.full((count,), value)
            comm.all_reduce(t, algorithm=algorithm)
            wrong += int((t != n * (n + 1) / 2 + n * round_).sum())
            t.fill_(float("nan"))  # at once: a peer still reading it would sum NaN
            del t

            block = torch.full((count,), value)
            gathered = torch.empty(n * count)
            comm.all_gather(gathered, block, algorithm=algorithm)
            block.fill_(-1.0)
            expected = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(count)
            wrong += int((gathered != expected + round_).sum())
            del block, gathered

            root = torch.full((count,), value) if rank == 0 else torch.empty(count)
            comm.broadcast(root, src=0)
            wrong += int((root != 1 + round_).sum())
            root.fill_(-2.0)
            del root
    comm.close()
    return wrong


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_buffers_overwritten_right_after_each_call_leave_every_result_exact(n, algorithm):
    assert launch(n, scribbling, algorithm) == [0] * n


def sends_then_frees(rank, n):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60)
    got = []
    for count in COUNTS:
        if rank == 0:
            message = torch.arange(count, dtype=torch.float32)
            comm.send(message, dst=1)
            message.fill_(-1.0)  # the receiver has not even asked yet
            del message
            torch.empty(count).fill_(-3.0)  # memory reused
        else:
            time.sleep(0.2)
            message = torch.empty(count)
            comm.recv(message, src=0)
            got.append(bool(torch.equal(message, torch.arange(count, dtype=torch.float32))))
    comm.close()
    return got


def test_a_sender_may_overwrite_and_free_its_buffer_before_the_receive():
    assert launch(2, sends_then_frees)[1] == [True] * len(COUNTS)
