"""Sends and receives posted as one batch, driven through the NcclTransport that ships over the
host implementation of CUDA and NCCL (_testing.host_gpu), where a send blocks until its
matching receive is posted, as on NCCL. Posted one by one, two ranks that both send first wait
for each other until the timeout; as one batch (Communicator.batch_isend_irecv, and
torch.distributed.batch_isend_irecv through the torch backend) they exchange, exactly, in one
NCCL group per rank. Mismatched batches fail within the timeout."""
import time

import pytest
import torch
import torch.distributed as dist

from host_gpu_world import host_gpu, host_nccl_backend, raise_first, run_ranks  # noqa: I100

from ringcomm import _C, P2POp
from ringcomm.c10d.backend import RingcommBackend
from ringcomm.c10d.capabilities import BACKEND_PER_DEVICE
from ringcomm.c10d.process_group import group_over

TIMEOUT = 2.0
BIG = 100_003  # float32: 400 KB, far more than the 4 x 256-byte staging slots


def _values(src, dst, count, dtype=torch.float32, k=0):
    """What rank src sends rank dst as its k-th message: distinct small integers."""
    return ((torch.arange(count) * 7 + 1000 * src + 100 * dst + 10 * k) % 4093).to(dtype)


def _core(comm):
    """The rank's _C.Communicator over NcclTransport (host-GPU ring), without the wrapper that
    waits for every call: the host does not wait on CUDA either."""
    return comm._router.communicator_for("cpu", -1)._comm


def _group_ends():
    return host_gpu.calls().get("ncclGroupEnd", 0)


# -- the old order deadlocks; the batch exchanges ---------------------------------------------

def test_both_ranks_sending_first_one_by_one_waits_for_ever_on_nccl():
    """Send, then receive, on both ranks: each send waits for a receive its peer posts only
    after its own send. Nothing moves until the timeout aborts both (the batch below is what
    fixes it)."""
    f32 = _C.DataType.float32

    def body(comm):
        core, peer = _core(comm), 1 - comm.rank
        out, got = _values(comm.rank, peer, BIG), torch.zeros(BIG)
        core.send(out.data_ptr(), BIG, f32, peer, 0)
        core.recv(got.data_ptr(), BIG, f32, peer, 0)
        comm._router.communicator_for("cpu", -1).ring.synchronize()
        return "done"

    with host_nccl_backend(slice_bytes=256, slots=4, timeout=TIMEOUT):
        start = time.monotonic()
        results = run_ranks(2, body, timeout=TIMEOUT)
        elapsed = time.monotonic() - start
    for result in results:
        assert isinstance(result, _C.CommTimeoutError), result
        assert "send did not finish within" in str(result), str(result)
    assert elapsed < 3 * TIMEOUT + 5, elapsed
    assert host_gpu.violations() == []


def _exchange_both_ways(comm):
    """Both ranks list their sends first: two large messages and an empty one each way, with
    other dtypes and tags, then the receives."""
    r, peer = comm.rank, 1 - comm.rank
    sizes = [(BIG, torch.float32), (0, torch.int64), (4099, torch.bfloat16)]
    sends = [P2POp("send", _values(r, peer, n, dtype, k), peer, tag=k) for k, (n, dtype) in
             enumerate(sizes)]
    got = [torch.full((n,), -1, dtype=dtype) for n, dtype in sizes]
    comm.batch_isend_irecv(sends + [P2POp("recv", t, peer, tag=k) for k, t in enumerate(got)])
    return [bool(torch.equal(t, _values(peer, r, n, dtype, k)))
            for k, (t, (n, dtype)) in enumerate(zip(got, sizes))]


@pytest.mark.parametrize("posts_in_progress", [False, True])
def test_both_ranks_sending_first_in_one_batch_is_exact(posts_in_progress):
    with host_nccl_backend(slice_bytes=256, slots=4, timeout=10.0):
        host_gpu.set_posts_in_progress(posts_in_progress)
        results = raise_first(run_ranks(2, _exchange_both_ways))
        assert _group_ends() == 2, host_gpu.calls()  # one NCCL group per rank
    assert results == [[True] * 3] * 2
    assert host_gpu.violations() == []


def _ring_exchange(comm):
    """One batch per round: send to both neighbours, receive from both (at world 2 both are
    the same rank: two messages each way, which pair in order)."""
    r, n = comm.rank, comm.world_size
    nxt, prv = (r + 1) % n, (r - 1) % n
    wrong = []
    for round_, count in enumerate([1, 257, BIG]):
        from_prv, from_nxt = torch.zeros(count), torch.zeros(count)
        comm.batch_isend_irecv([
            P2POp("send", _values(r, nxt, count, k=round_), nxt),
            P2POp("send", _values(r, prv, count, k=round_) + 0.5, prv),
            P2POp("recv", from_prv, prv),
            P2POp("recv", from_nxt, nxt),
        ])
        if not torch.equal(from_prv, _values(prv, r, count, k=round_)):
            wrong.append(f"round {round_}: from rank {prv}")
        if not torch.equal(from_nxt, _values(nxt, r, count, k=round_) + 0.5):
            wrong.append(f"round {round_}: from rank {nxt}")
    return wrong


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_exchange_in_one_batch_is_exact(n):
    host_gpu.set_jitter(200)  # a missing stream wait shows as a wrong value
    with host_nccl_backend(slice_bytes=256, slots=4, timeout=10.0):
        results = raise_first(run_ranks(n, _ring_exchange))
        assert _group_ends() == 3 * n, host_gpu.calls()  # one group per rank and round
    assert results == [[]] * n
    assert host_gpu.violations() == []


# -- mismatched batches fail within the timeout -------------------------------------------------


def _timed(body):
    """body on 2 ranks of the host NCCL: each rank's result or exception, and the seconds taken."""
    with host_nccl_backend(timeout=TIMEOUT):
        start = time.monotonic()
        results = run_ranks(2, body, timeout=TIMEOUT)
        return results, time.monotonic() - start

def test_a_batch_with_a_message_too_many_times_out_naming_the_batch():
    """Rank 0 sends two messages, rank 1 receives one: rank 1's batch completes, rank 0's group
    never does."""
    def body(comm):
        peer = 1 - comm.rank
        if comm.rank == 0:
            comm.batch_isend_irecv([P2POp("send", torch.ones(64), peer),
                                    P2POp("send", torch.ones(64), peer)])
        else:
            comm.batch_isend_irecv([P2POp("recv", torch.zeros(64), peer)])
        comm._router.communicator_for("cpu", -1).ring.synchronize()
        return "done"

    results, elapsed = _timed(body)
    assert isinstance(results[0], _C.CommTimeoutError), results[0]
    assert "batch_isend_irecv did not finish within" in str(results[0]), str(results[0])
    assert results[1] == "done"
    assert elapsed < 3 * TIMEOUT + 5, elapsed
    assert host_gpu.violations() == []


def test_a_batch_whose_sizes_differ_fails_clearly():
    def body(comm):
        peer = 1 - comm.rank
        comm.batch_isend_irecv([P2POp("send", torch.ones(64), peer),
                                P2POp("recv", torch.zeros(64 + comm.rank), peer)])
        comm._router.communicator_for("cpu", -1).ring.synchronize()
        return "done"

    results, elapsed = _timed(body)
    for result in results:
        assert isinstance(result, _C.RingcommError), result
    assert any("truncated" in str(r) for r in results), results
    assert elapsed < 3 * TIMEOUT + 5, elapsed
    assert host_gpu.violations() == []


def test_bad_batches_are_refused_before_anything_is_sent():
    def body(comm):
        peer, errors = 1 - comm.rank, []
        buf = torch.zeros(8)
        for ops, kind in [
            ([P2POp("send", buf[:6], peer), P2POp("recv", buf[4:], peer)], _C.RingcommError),
            ([P2POp("recv", buf, peer), P2POp("recv", buf, peer)], _C.RingcommError),
            ([P2POp("send", buf, comm.rank)], ValueError),
            ([P2POp("gather", buf, peer)], ValueError),
            ([dist.P2POp], TypeError),
        ]:
            with pytest.raises(kind) as raised:
                comm.batch_isend_irecv(ops)
            errors.append(str(raised.value))
        # Still usable: sends that overlap each other are fine (nothing writes them).
        buf.copy_(torch.arange(8.0) + 10 * comm.rank)
        got, got_part = torch.zeros(8), torch.zeros(6)
        comm.batch_isend_irecv([P2POp("send", buf, peer), P2POp("send", buf[2:], peer),
                                P2POp("recv", got, peer), P2POp("recv", got_part, peer)])
        expected = torch.arange(8.0) + 10 * peer
        assert torch.equal(got, expected) and torch.equal(got_part, expected[2:])
        return errors

    with host_nccl_backend(timeout=10.0):
        results = raise_first(run_ranks(2, body))
    for errors in results:
        assert "overlaps" in errors[0] and "#1 (recv from rank" in errors[0], errors[0]
        assert "overlaps" in errors[1], errors[1]
        assert "is this rank" in errors[2], errors[2]
        assert "'send' or 'recv'" in errors[3], errors[3]
        assert "ringcomm.P2POp" in errors[4], errors[4]
    assert host_gpu.violations() == []


# -- torch.distributed.batch_isend_irecv through the torch backend ------------------------------

def _torch_batches(comm):
    """torch's own batch_isend_irecv on a ringcomm process group whose point-to-point runs over
    the host NCCL: both ranks list their sends first, large messages, a non-contiguous receive.
    Outside a batch, isend and irecv still go out one by one, in an order that meets."""
    r, n = comm.rank, comm.world_size
    pg = group_over(RingcommBackend(None, r, n, None, communicator=comm), dist.HashStore())
    # What init_process_group records for a group (threads share one torch.distributed state).
    dist.distributed_c10d._world.pg_group_ranks[pg] = {q: q for q in range(n)}
    try:
        peer = 1 - r
        got = torch.zeros(BIG)
        strided = torch.zeros(2, 64).t()  # not contiguous: received into a copy, copied back
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, _values(r, peer, BIG), group=pg, group_peer=peer),
            dist.P2POp(dist.isend, _values(r, peer, 128, k=1).view(2, 64).t(), group=pg,
                       group_peer=peer, tag=3),
            dist.P2POp(dist.irecv, got, group=pg, group_peer=peer),
            dist.P2POp(dist.irecv, strided, group=pg, group_peer=peer, tag=3),
        ])
        waited = [w.wait() for w in works]
        completed = [w.is_completed() for w in works]
        exact = [torch.equal(got, _values(peer, r, BIG)),
                 torch.equal(strided, _values(peer, r, 128, k=1).view(2, 64).t())]
        single = torch.zeros(5)
        if r == 0:
            dist.isend(torch.arange(5.0), group=pg, group_dst=1).wait()
        else:
            dist.irecv(single, group=pg, group_src=0).wait()
        return len(works), waited, completed, exact, single.tolist()
    finally:
        del dist.distributed_c10d._world.pg_group_ranks[pg]


def test_torch_batch_isend_irecv_goes_out_as_one_group():
    with host_nccl_backend(slice_bytes=256, slots=4, timeout=10.0):
        results = raise_first(run_ranks(2, _torch_batches))
        # One group per rank for its batch, then one for the single send and one for its receive.
        assert _group_ends() == 2 + 2, host_gpu.calls()
    for rank, (works, waited, completed, exact, single) in enumerate(results):
        count = 1 if BACKEND_PER_DEVICE else 4  # torch >= 2.14 coalesces: one Work
        assert works == count and waited == [True] * count and completed == [True] * count
        assert exact == [True, True]
        assert single == ([0.0] * 5 if rank == 0 else [0.0, 1.0, 2.0, 3.0, 4.0])
    assert host_gpu.violations() == []
