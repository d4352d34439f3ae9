"""Communicator.stats(): what the shared-memory transports counted, per peer, for the ring, the
one-hop publications and the point-to-point links; reset_stats() starts again from zero."""
import torch

import ringcomm
from launcher import launch


def _traffic(rank, world):
    comm = ringcomm.Communicator(timeout=60, algorithm="ring")
    count = 3 * 1024  # 12 KiB: equal 16-byte-aligned chunks at 3 ranks
    seen = {}
    comm.reset_stats()
    comm.all_reduce(torch.ones(count))
    seen["ring"] = comm.stats()
    comm.reset_stats()
    comm.all_reduce(torch.ones(8), algorithm="one_shot")
    seen["one_shot"] = comm.stats()
    comm.reset_stats()
    if rank == 0:
        comm.send(torch.ones(100), 1, tag=3)
    elif rank == 1:
        comm.recv(torch.empty(100), 0, tag=3)
    seen["p2p"] = comm.stats()
    comm.reset_stats()
    seen["reset"] = comm.stats()
    comm.close()
    return seen


def test_stats_count_what_each_transport_moved():
    n, count = 3, 3 * 1024
    results = launch(n, _traffic)
    for rank, seen in enumerate(results):
        ring, nxt, prev = seen["ring"], (rank + 1) % n, (rank - 1) % n
        share = 2 * (n - 1) * count * 4 // n
        assert ring.bytes_sent[nxt] == share and ring.total_sent == share
        assert ring.bytes_received[prev] == share and ring.total_received == share
        assert ring.collectives == 1 and ring.bytes_published == 0
        assert ring.messages_sent[nxt] >= 2 * (n - 1)
        assert sum(ring.waits_ended.values()) == ring.waits and ring.wait_seconds >= 0

        one_shot = seen["one_shot"]  # every rank publishes 32 B and reads every publication
        assert one_shot.bytes_published == 32 and one_shot.publications == 1
        assert one_shot.bytes_received == [32] * n and one_shot.total_sent == 0

        p2p = seen["p2p"]
        assert p2p.bytes_sent == ([0, 400, 0] if rank == 0 else [0, 0, 0])
        assert p2p.bytes_received == ([400, 0, 0] if rank == 1 else [0, 0, 0])
        assert p2p.collectives == 0

        reset = seen["reset"]
        assert reset.total_sent == reset.total_received == reset.waits == reset.collectives == 0
