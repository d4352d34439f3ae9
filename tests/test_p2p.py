"""Point-to-point (send/recv) and all-to-all on the Python API, real processes over shared
memory, checked element for element against exact references: every dtype, awkward counts
(0, 1, fewer than ranks, primes, several slots' worth), uneven splits, every pair of ranks."""
import pytest
import torch

import ringcomm
from launcher import launch
from sweep import DTYPES, wrong

COUNTS = [0, 1, 2, 7, 31, 100003]  # 100003 float64: several 64 KiB slots per message


def block(src, dst, count, dtype):
    """What rank src sends rank dst: distinct small integers (exact in every dtype)."""
    values = (torch.arange(count) * 3 + 7 * src + dst) % 100
    return (values % 2).to(dtype) if dtype == torch.bool else values.to(dtype)


def _communicator_and_check(rank):
    """This rank's communicator, its failures, and check(name, actual, expected) adding to them."""
    torch.set_num_threads(1)
    comm = ringcomm.Communicator(timeout=60)
    failures = []

    def check(name, actual, expected):
        bad = wrong(actual, expected)
        if bad:
            failures.append(f"rank {rank}: {name}: {bad} wrong")

    return comm, failures, check


def _sweep(rank, n):
    comm, failures, check = _communicator_and_check(rank)

    for dtype in DTYPES:
        for count in COUNTS:
            # all_to_all, equal splits: count elements per pair.
            inp = torch.cat([block(rank, p, count, dtype) for p in range(n)])
            out = torch.empty(n * count, dtype=dtype)
            comm.all_to_all(out, inp)
            check(f"all_to_all {dtype} {count}", out,
                  torch.cat([block(p, rank, count, dtype) for p in range(n)]))
            # Uneven splits over rows of 3: rank s sends rank d (count + s + 2 d) % 5 rows.
            rows = lambda s, d: (count + s + 2 * d) % 5  # noqa: E731
            inp = torch.cat([block(rank, p, rows(rank, p) * 3, dtype) for p in range(n)]).view(-1, 3)
            out = torch.empty(sum(rows(p, rank) for p in range(n)), 3, dtype=dtype)
            comm.all_to_all(out, inp, [rows(p, rank) for p in range(n)],
                            [rows(rank, p) for p in range(n)])
            check(f"all_to_all uneven {dtype} {count}", out.reshape(-1),
                  torch.cat([block(p, rank, rows(p, rank) * 3, dtype) for p in range(n)]))
        # send/recv between every ordered pair, lower rank first so nothing waits in a cycle.
        for src in range(n):
            for dst in range(n):
                if src == dst or rank not in (src, dst):
                    continue
                for tag, count in enumerate(COUNTS):
                    if rank == src:
                        comm.send(block(src, dst, count, dtype), dst, tag=tag)
                    else:
                        got = torch.empty(count, dtype=dtype)
                        comm.recv(got, src, tag=tag)
                        check(f"send/recv {src}->{dst} {dtype} {count}", got,
                              block(src, dst, count, dtype))
    # Bad arguments raise before anything is sent.
    for call, kind in [(lambda: comm.send(torch.ones(1), rank), ValueError),
                       (lambda: comm.recv(torch.ones(1), n), ValueError),
                       (lambda: comm.all_to_all(torch.empty(n), torch.ones(n + 1)), ValueError),
                       (lambda: comm.all_to_all(torch.empty(n), torch.ones(n), [1] * (n + 1)),
                        ValueError)]:
        with pytest.raises(kind):
            call()
    comm.close()
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_send_recv_and_all_to_all_exact(world_size):
    failures = [f for fs in launch(world_size, _sweep, timeout=300) for f in fs]
    assert not failures, "\n".join(failures[:20])


def _batches(rank, n):
    """Communicator.batch_isend_irecv over shared memory: every rank lists its sends first, to
    every other rank, messages of several times what a link holds (a send waits for room),
    then two more to the next rank; and a batch that receives what single sends sent."""
    comm, failures, check = _communicator_and_check(rank)

    big = 300_007  # float64: 2.4 MB, past the 16 x 64 KiB slots of a link
    others = [p for p in range(n) if p != rank]
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = {p: torch.empty(big, dtype=torch.float64) for p in others}
    small, empty = torch.empty(31, dtype=torch.int8), torch.empty(0, dtype=torch.bfloat16)
    comm.batch_isend_irecv(
        [ringcomm.P2POp("send", block(rank, p, big, torch.float64), p) for p in others]
        + [ringcomm.P2POp("send", block(rank, nxt, 31, torch.int8), nxt, tag=3),
           ringcomm.P2POp("send", torch.empty(0, dtype=torch.bfloat16), nxt, tag=4)]
        + [ringcomm.P2POp("recv", got[p], p) for p in others]
        + [ringcomm.P2POp("recv", small, prv, tag=3), ringcomm.P2POp("recv", empty, prv, tag=4)])
    for p in others:
        check(f"batch from {p}", got[p], block(p, rank, big, torch.float64))
    check("batch, second message from the previous rank", small, block(prv, rank, 31, torch.int8))
    # Single sends and one batch on the other side pair up: messages count per pair.
    if rank == 0:
        comm.send(block(0, 1, 7, torch.int32), 1, tag=1)
        comm.send(block(0, 1, big, torch.float64), 1, tag=2)
    elif rank == 1:
        a, b = torch.empty(7, dtype=torch.int32), torch.empty(big, dtype=torch.float64)
        comm.batch_isend_irecv([("recv", a, 0, 1), ("recv", b, 0, 2)])
        check("singles into a batch", torch.cat([a.double(), b]),
              torch.cat([block(0, 1, 7, torch.int32).double(), block(0, 1, big, torch.float64)]))
    comm.close()
    return failures


@pytest.mark.parametrize("world_size", [2, 3])
def test_batch_isend_irecv_exact(world_size):
    failures = [f for fs in launch(world_size, _batches, timeout=300) for f in fs]
    assert not failures, "\n".join(failures[:20])


def _mismatch(rank, n):
    comm = ringcomm.Communicator(timeout=20)
    try:
        if rank == 0:
            comm.send(torch.ones(4), 1, tag=1)
            comm.send(torch.ones(4), 1, tag=2)
        else:
            comm.recv(torch.empty(4), 0, tag=1)
            comm.recv(torch.empty(5), 0, tag=2)  # another count: must not be silently cut
        return None
    except ringcomm.RingcommError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        comm.close()  # rank 0 may get here first: its messages must still reach rank 1


def test_recv_that_does_not_match_the_send_raises():
    results = launch(2, _mismatch, timeout=120)
    assert results[0] is None
    assert results[1].startswith("MismatchError") and "send_recv" in results[1], results[1]


def test_core_all_to_all_refuses_overlapping_buffers():
    """The C++ check behind Python's: a block received into bytes a later step still sends
    would corrupt it (and on NCCL would split a step's group). A refused call leaves the
    communicator usable."""
    import numpy as np

    from ringcomm import _C
    from ringcomm.options import DEFAULTS

    transport = _C.ShmTransport(0, 1, 64 * 1024, 4, 10.0, 0, DEFAULTS["yield_us"],
                                DEFAULTS["publish_bytes"])
    comm = _C.Communicator(0, 1, transport, _C.CpuReducer(), 64 * 1024)
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(_C.RingcommError, match="must not overlap"):
        comm.all_to_all(x.ctypes.data + 4, x.ctypes.data, [4], [4], _C.DataType.float32)
    out = np.zeros(8, dtype=np.float32)
    comm.all_to_all(out.ctypes.data, x.ctypes.data, [8], [8], _C.DataType.float32)
    assert comm.failure == "" and (out == x).all()
    comm.close()


def _envelopes(rank, n):
    """The debug envelope CUDA sends and receives exchange first (NCCL carries no header), on
    CPU buffers over the same CPU links: matching calls pass, a different count or tag raises
    MismatchError on the receiving rank, naming both."""
    import ringcomm
    from ringcomm.buffers import as_buffer

    comm = ringcomm.Communicator(timeout=20, debug=True)
    outcomes = []
    for sent, expected in [((5, 7), (5, 7)), ((5, 8), (5, 7)), ((6, 7), (5, 7))]:
        tag, count = sent if rank == 0 else expected
        buf = as_buffer(torch.zeros(count), "tensor")
        try:
            comm._p2p._debug_envelope("send" if rank == 0 else "recv", 1 - rank, buf, tag)
            outcomes.append("ok")
        except ringcomm.MismatchError as error:
            outcomes.append(str(error))
    # A batch's envelopes: both ranks send theirs first, then compare what they receive.
    peer, buf = 1 - rank, as_buffer(torch.zeros(5), "tensor")
    try:
        comm._p2p._debug_envelopes([(True, buf, peer, 9), (False, buf, peer, 9 + rank)])
        outcomes.append("ok")
    except ringcomm.MismatchError as error:
        outcomes.append(str(error))
    comm.close()
    return outcomes


def test_debug_envelopes_catch_a_wrong_count_or_tag():
    sender, receiver = launch(2, _envelopes, timeout=60)
    assert sender == ["ok"] * 4
    assert "it sent tag 9, 5 x float32" in receiver[3] and "expected tag 10" in receiver[3]
    assert receiver[0] == "ok"
    assert "it sent tag 5, 8 x float32" in receiver[1] and "expected tag 5, 7 x float32" in receiver[1]
    assert "it sent tag 6, 7 x float32" in receiver[2]
