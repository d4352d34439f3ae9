"""The NcclTransport that ships, driven without a GPU: every CUDA and NCCL call it makes goes to
the host implementation (_testing.host_gpu), which moves real bytes with NCCL's pairing,
group and stream semantics and records misuse. Exact results for every plan at worlds 2-8,
then the failure paths: a dead peer, a skipped collective, a missing peer, mismatched sizes."""
import gc
import time

import pytest
import torch

from host_gpu_world import host_gpu, host_nccl_backend, raise_first, run_ranks  # noqa: I100
from collective_checks import VALID, Checker, counts_for, one_dtype_per_op
from sweep import DTYPES
from tiers import world_sizes

from ringcomm import _C
from ringcomm.options import DEFAULTS


def _sweep(cases, copy_dtypes):
    def body(comm):
        checker = Checker(comm)
        for count in counts_for(comm.world_size) + [4099]:
            for dtype, op in cases:
                checker.reductions(count, dtype, op)
            for dtype in copy_dtypes:
                checker.copies(count, dtype)
        return checker.failures, checker.cases
    return body


def _check(results):
    for failures, cases in raise_first(results):
        assert cases > 0 and not failures, failures[:10]
    assert host_gpu.violations() == []


@pytest.mark.parametrize("n", [2, 3])
def test_every_dtype_op_and_collective_is_exact(n):
    """256-byte slots: a 4099-element tensor is dozens of slices per step, through 4 slots."""
    with host_nccl_backend(slice_bytes=256, slots=4):
        _check(run_ranks(n, _sweep(VALID, DTYPES)))


@pytest.mark.parametrize("n", world_sizes([4, 5, 6, 7, 8]))
def test_every_plan_is_exact_at_larger_worlds(n):
    with host_nccl_backend(slice_bytes=512, slots=4):
        _check(run_ranks(n, _sweep(one_dtype_per_op(), [torch.float32, torch.int8])))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_one_hop_algorithms_are_exact(n, algorithm):
    """Publications exchanged in one group with every peer, two_shot's uneven chunks declared."""
    with host_nccl_backend(slice_bytes=256, slots=4, publish_bytes=1024):
        _check(run_ranks(n, _sweep([(torch.float32, "sum"), (torch.int32, "max")],
                                   [torch.float32]), algorithm=algorithm))


def test_stream_order_holds_under_jitter():
    """Every stream's work starts after a random delay: a missing event wait shows as #wrong."""
    host_gpu.set_jitter(300)
    with host_nccl_backend(slice_bytes=256, slots=2):
        _check(run_ranks(3, _sweep([(torch.float32, "sum"), (torch.int64, "min")],
                                   [torch.int8])))


def _ring(comm):
    """The communicator's _C.Communicator over NcclTransport (point-to-point on CPU tensors
    would take shared-memory links: call the core directly)."""
    return comm._router.communicator_for("cpu", -1)


def _send(core, tensor, peer):
    core.send(tensor.data_ptr(), tensor.numel(), _C.DataType.__members__[str(tensor.dtype)[6:]], peer, 0)


def _recv(core, tensor, peer):
    core.recv(tensor.data_ptr(), tensor.numel(), _C.DataType.__members__[str(tensor.dtype)[6:]], peer, 0)


def _point_to_point(comm):
    core, r, n = _ring(comm), comm.rank, comm.world_size
    got = torch.zeros(5, dtype=torch.int32)
    if r % 2 == 0 and r + 1 < n:
        _send(core, torch.arange(5, dtype=torch.int32) + r, r + 1)
    elif r % 2 == 1:
        _recv(core, got, r - 1)
    counts = [(r + q) % 3 for q in range(n)]  # rank r sends (r + q) % 3 elements to q
    inp = torch.cat([torch.full((c,), r * 100 + q, dtype=torch.int64) for q, c in enumerate(counts)])
    received = [(q + r) % 3 for q in range(n)]
    out = torch.empty(sum(received), dtype=torch.int64)
    core.all_to_all(out.data_ptr(), inp.data_ptr(), counts, received, _C.DataType.int64)
    want = torch.cat([torch.full((c,), q * 100 + r, dtype=torch.int64) for q, c in enumerate(received)])
    return got.tolist(), bool(torch.equal(out, want))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_send_recv_and_all_to_all(n):
    with host_nccl_backend():
        results = raise_first(run_ranks(n, _point_to_point))
    for r, (got, all_to_all_ok) in enumerate(results):
        assert all_to_all_ok
        if r % 2 == 1:
            assert got == [r - 1 + i for i in range(5)]
    assert host_gpu.violations() == []


# -- failures: an error within the timeout and a few seconds, no hang, no misuse of NCCL -------

TIMEOUT = 3.0


def _all_reduces(comm, calls=3, count=4099):
    for _ in range(calls):
        comm.all_reduce(torch.ones(count))
    return "done"


def _assert_timed_out(result, *words):
    assert isinstance(result, _C.CommTimeoutError), result
    for word in words:
        assert word in str(result), str(result)


def test_a_peer_that_dies_mid_collective_gives_a_timeout():
    host_gpu.set_stall(1, 5)  # rank 1 stops moving data after its 5th NCCL group
    with host_nccl_backend(slice_bytes=256, slots=4, timeout=TIMEOUT):
        start = time.monotonic()
        results = run_ranks(2, _all_reduces, timeout=TIMEOUT)
        elapsed = time.monotonic() - start
    # The collective that was still running, and the peers of the rank.
    _assert_timed_out(results[0], "all_reduce #", "did not finish within", "rank 0 of 2",
                      "receives from rank 1")
    assert elapsed < 3 * TIMEOUT + 5, elapsed
    assert host_gpu.violations() == []


def test_a_skipped_collective_gives_a_timeout_naming_the_collective():
    def body(comm):
        comm.all_reduce(torch.ones(4099))
        if comm.rank == 0:
            comm.all_reduce(torch.ones(4099))  # rank 1 skips it
            comm.ring_synchronize()
        return "done"

    def skipping(comm):
        comm.ring_synchronize = lambda: _ring(comm).ring.synchronize()
        return body(comm)

    with host_nccl_backend(slice_bytes=1024, slots=4, timeout=TIMEOUT):
        results = run_ranks(2, skipping, timeout=TIMEOUT)
    _assert_timed_out(results[0], "all_reduce #1 did not finish within", "rank 0 of 2")
    assert results[1] == "done"
    assert host_gpu.violations() == []


def test_a_peer_that_never_joins_gives_a_timeout_at_creation():
    with host_nccl_backend(timeout=TIMEOUT):
        uid = host_gpu.unique_id()
        start = time.monotonic()
        with pytest.raises(_C.CommTimeoutError, match="creating the NCCL communicator.*rank 0 of 2"):
            host_gpu.TransportAndReducer(0, 2, uid, slice_bytes=DEFAULTS["cuda_slice_bytes"],
                          slots=DEFAULTS["cuda_slot_count"], publish_bytes=0, timeout=TIMEOUT,
                          cuda_graphs=DEFAULTS["cuda_graphs"], nccl_sms=DEFAULTS["nccl_sms"])
        assert time.monotonic() - start < TIMEOUT + 3
    assert host_gpu.violations() == []


def test_mismatched_sizes_fail_clearly_instead_of_hanging():
    def body(comm):
        comm.all_reduce(torch.ones(64 + comm.rank))
        _ring(comm).ring.synchronize()
        return "done"

    with host_nccl_backend(slice_bytes=1 << 20, timeout=TIMEOUT):
        results = run_ranks(2, body, timeout=TIMEOUT)
    for result in results:
        assert isinstance(result, _C.RingcommError), result
    assert any("truncated" in str(r) or "did not finish" in str(r) for r in results), results
    assert host_gpu.violations() == []


# -- the host implementation catches what it should ----------------------------------------------

def test_the_host_nccl_deadlocks_on_unmatched_order_as_nccl_does():
    """Rank 0 sends two messages to rank 1, which first waits for a message rank 0 sends later
    (another size): NCCL pairs by order, so this never completes; the transport times out."""
    def body(comm):
        core = _ring(comm)
        if comm.rank == 0:
            _send(core, torch.ones(8), 1)
            _send(core, torch.ones(16), 1)
        else:
            _recv(core, torch.empty(16), 0)
        core.ring.synchronize()
        return "done"

    with host_nccl_backend(timeout=TIMEOUT):
        results = run_ranks(2, body, timeout=TIMEOUT)
    assert any(isinstance(r, _C.RingcommError) for r in results), results


def test_per_step_host_work_does_not_grow_device_queries():
    """cudaGetDevice, cudaSetDevice and stream-capture queries are per collective, never per
    step: ten times the slices cost no more of them."""
    def calls_for(count):
        gc.collect()  # rings of earlier tests are released now, not while this one counts
        with host_nccl_backend(slice_bytes=256, slots=4):
            raise_first(run_ranks(2, lambda comm: _all_reduces(comm, calls=2, count=count)))
            return host_gpu.calls()

    few, many = calls_for(640), calls_for(6400)
    assert many["ncclGroupEnd"] > 5 * few["ncclGroupEnd"]
    for name in ("cudaGetDevice", "cudaSetDevice", "cudaStreamIsCapturing"):
        assert many.get(name, 0) == few.get(name, 0), (name, few, many)
    assert host_gpu.violations() == []


# -- publications: what the transport refuses before NCCL could hang on it -----------------------

PUBLISH_BYTES = 4096


def _two_rings(publish_bytes=PUBLISH_BYTES):
    """Rank 0's and rank 1's host-GPU rings of one world (creation waits for both)."""
    import threading

    uid, rings = host_gpu.unique_id(), [None, None]

    def make(rank):
        rings[rank] = host_gpu.TransportAndReducer(rank, 2, uid, slice_bytes=256, slots=4,
                                    publish_bytes=publish_bytes, timeout=TIMEOUT,
                                    cuda_graphs=DEFAULTS["cuda_graphs"],
                                    nccl_sms=DEFAULTS["nccl_sms"])

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return rings


@pytest.mark.parametrize("program,error", [
    ([("read", 1, 0, 8)], "before this rank published it"),
    ([("publish", 0, 8), ("read", 1, 0, 16)], "without declared sizes"),
    ([("publish", 0, 8), ("expect", 0, [8, 16]), ("read", 1, 0, 8)], "the declared size differs"),
    ([("publish", 0, 8), ("expect", 0, [8])], "for 1 ranks in a world of 2"),
    ([("publish", 0, 8), ("expect", 0, [8, PUBLISH_BYTES + 1])], "exceeds"),
    ([("expect", 0, [8, 8])], "declared in a round"),
    ([("publish", 0, 8), ("read", 1, 0, 8), ("expect", 0, [8, 8])], "before its first read"),
    ([("publish", 0, 8), ("read", 0, 0, 16)], "own publication of phase 0"),
    ([("publish", 0, PUBLISH_BYTES + 1)], "exceeds"),
    ([("publish", 1, 8)], "after phase 0"),
    ([("publish", 0, 8), ("end",)], "never read"),
    ([("publish", 2, 8)], "phase 2"),
    ([("read", 5, 0, 8)], "outside the world"),
])
def test_publication_misuse_is_refused(program, error):
    """A size no peer sends, a publication nobody receives: refused by the bookkeeping, before
    any NCCL call could wait for ever."""
    host_gpu.reset()
    import threading

    rings = _two_rings()
    # Where rank 0's program exchanges before it fails, rank 1 takes part in that exchange.
    partner = threading.Thread(target=rings[1].run_publications,
                               args=(1, [("publish", 0, 8), ("read", 0, 0, 8)]))
    exchanges = error == "before its first read"
    try:
        if exchanges:
            partner.start()
        with pytest.raises(_C.RingcommError, match=error):
            rings[0].run_publications(0, program)
    finally:
        if exchanges:
            partner.join(30)
        for ring in rings:
            ring.release()
    assert host_gpu.violations() == []


def test_no_publications_without_room():
    rings = _two_rings(publish_bytes=0)
    try:
        with pytest.raises(_C.RingcommError, match="no publications"):
            rings[0].run_publications(0, [("publish", 0, 8)])
    finally:
        for ring in rings:
            ring.release()


# -- CUDA graphs -----------------------------------------------------------------------------------

def _warm_up(core):
    """One eager collective: NCCL connects to the peers outside any capture."""
    token = torch.zeros(1)
    core.run(_C.CollectiveRequest(_C.Collective.all_reduce, token.data_ptr(), 0, 1,
                                  _C.DataType.float32, _C.RedOp.sum))


def _replays_beside_eager(comm):
    """An all_reduce captured in a graph, replayed on one stream while an eager all_reduce runs
    on another: they share staging slots and NCCL's pairing, so the transport runs them one
    after the other in launch order. Every round's results must be exact."""
    core, r, n = _ring(comm), comm.rank, comm.world_size
    capture, replaying, eager = host_gpu.new_stream(), host_gpu.new_stream(), host_gpu.new_stream()
    count = 3001
    buf, other = torch.zeros(count), torch.zeros(count)
    f32, add = _C.DataType.float32, _C.RedOp.sum
    _warm_up(core)
    host_gpu.begin_capture(capture)
    core.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, count, f32, add,
                                  stream=capture))
    graph = host_gpu.end_capture(capture)
    assert graph, "the capture did not end"
    total, rounds = n * (n + 1) // 2, []
    for round_ in range(4):
        buf.fill_(r + 1 + round_)
        other.fill_(2.0 * (r + 1))
        host_gpu.launch_graph(graph, replaying)
        core.run(_C.CollectiveRequest(_C.Collective.all_reduce, other.data_ptr(), 0, count, f32,
                                      add, stream=eager))
        host_gpu.synchronize_stream(replaying)
        host_gpu.synchronize_stream(eager)
        rounds.append((int((buf != total + n * round_).sum()), int((other != 2 * total).sum())))
    return rounds


@pytest.mark.parametrize("n", [2, 3])
def test_graph_replays_beside_eager_collectives_are_exact(n):
    host_gpu.set_jitter(200)
    with host_nccl_backend(slice_bytes=256, slots=2):
        results = raise_first(run_ranks(n, _replays_beside_eager))
    assert all(rounds == [(0, 0)] * 4 for rounds in results), results
    assert host_gpu.violations() == []


# -- CUDA's error state ----------------------------------------------------------------------------

def _query_while_running(comm):
    """query() while an all_reduce still runs leaves cudaErrorNotReady as this thread's last
    error (CUDA does the same); the next collective's first kernel launch checks
    cudaGetLastError, so a transport that does not clear it fails there."""
    core, count = _ring(comm), 4099
    stream = host_gpu.new_stream()
    buf = torch.zeros(count)
    f32, add = _C.DataType.float32, _C.RedOp.sum
    seen_running, wrong = 0, 0
    for round_ in range(4):
        buf.fill_(comm.rank + 1 + round_)
        core.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, count, f32, add,
                                      stream=stream))
        seen_running += not core.ring.query()
        host_gpu.synchronize_stream(stream)
        expected = comm.world_size * (comm.world_size + 1) // 2 + comm.world_size * round_
        wrong += int((buf != expected).sum())
    return seen_running, wrong, host_gpu.last_error()


def test_a_query_of_a_running_collective_leaves_no_error_behind():
    host_gpu.set_jitter(2000)
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(2, _query_while_running))
    assert all(running > 0 for running, _, _ in results), f"nothing was still running: {results}"
    assert [(wrong, error) for _, wrong, error in results] == [(0, 0), (0, 0)], results
    assert host_gpu.violations() == []


def test_sends_and_receives_in_progress_keep_the_group_posting():
    """On a non-blocking communicator NCCL may answer ncclSend/ncclRecv with ncclInProgress:
    taken, not failed."""
    with host_nccl_backend(slice_bytes=256, slots=4):
        host_gpu.set_posts_in_progress(True)
        _check(run_ranks(3, _sweep([(torch.float32, "sum"), (torch.int64, "max")],
                                   [torch.float16])))


def _capture_first(comm):
    """A capture cannot hold a communicator's first collective (NCCL would connect inside it):
    a clear error before anything is enqueued, and the communicator stays usable."""
    core, stream = _ring(comm), host_gpu.new_stream()
    buf = torch.full((100,), float(comm.rank + 1))
    request = _C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, 100,
                                   _C.DataType.float32, _C.RedOp.sum, stream=stream)
    host_gpu.begin_capture(stream)
    try:
        core.run(request)
        error = None
    except _C.RingcommError as raised:
        error = str(raised)
    host_gpu.end_capture(stream)
    core.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, 100,
                                  _C.DataType.float32, _C.RedOp.sum))
    return error, float(buf[0])


def test_a_capture_of_the_first_collective_is_refused_clearly():
    with host_nccl_backend(slice_bytes=256, slots=2):
        results = raise_first(run_ranks(2, _capture_first))
    for error, value in results:
        assert error and "warm-up" in error and "first collective" in error, error
        assert value == 3.0
    assert host_gpu.violations() == []


def _replay_after_close(comm):
    """close() with a graph still alive neither waits for replays nor frees what the graph
    uses: the graph replays exactly after it."""
    core, stream = _ring(comm), host_gpu.new_stream()
    count, n = 1000, comm.world_size
    buf = torch.zeros(count)
    _warm_up(core)
    host_gpu.begin_capture(stream)
    core.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, count,
                                  _C.DataType.float32, _C.RedOp.sum, stream=stream))
    graph = host_gpu.end_capture(stream)
    begun = time.monotonic()
    comm.close()
    closing = time.monotonic() - begun
    wrong = []
    for round_ in range(3):
        buf.fill_(comm.rank + 1 + round_)
        host_gpu.launch_graph(graph, stream)
        host_gpu.synchronize_stream(stream)
        wrong.append(int((buf != n * (n + 1) // 2 + n * round_).sum()))
    return closing, wrong


def test_closing_with_a_live_graph_keeps_what_it_replays():
    with host_nccl_backend(slice_bytes=256, slots=2, timeout=10.0):
        results = raise_first(run_ranks(2, _replay_after_close))
    for closing, wrong in results:
        assert wrong == [0, 0, 0], results
        assert closing < 5.0, f"close() waited {closing:.1f} s (finalize waits for replays)"
    assert host_gpu.violations() == []


# -- recorded collectives --------------------------------------------------------------------------

def _repeat_on_the_same_buffers(comm):
    """A tagged all_reduce on the same buffers again and again (DDP's buckets) is recorded at
    its second call and replayed by the later ones, interleaved with untagged collectives on
    other buffers and streams: every result exact, in launch order."""
    core, n, r = _ring(comm), comm.world_size, comm.rank
    main, side = host_gpu.new_stream(), host_gpu.new_stream()
    bucket, kept = torch.zeros(3001), []  # kept: fresh buffers never reuse an address
    f32, f64, add, top = _C.DataType.float32, _C.DataType.float64, _C.RedOp.sum, _C.RedOp.max
    _warm_up(core)
    total, wrong = n * (n + 1) // 2, []
    for round_ in range(6):
        bucket.fill_(r + 1 + round_)
        core.run(_C.CollectiveRequest(_C.Collective.all_reduce, bucket.data_ptr(), 0, 3001, f32,
                                      add, stream=main, replay_tag=0))
        fresh = torch.full((777,), float(r * round_), dtype=torch.float64)  # new buffers
        core.run(_C.CollectiveRequest(_C.Collective.all_reduce, fresh.data_ptr(), 0, 777, f64,
                                      top, stream=side))
        host_gpu.synchronize_stream(main)
        host_gpu.synchronize_stream(side)
        wrong.append((int((bucket != total + n * round_).sum()),
                      int((fresh != (n - 1) * round_).sum())))
        kept.append(fresh)
    return wrong


@pytest.mark.parametrize("n", [2, 3])
def test_repeated_collectives_replay_a_recorded_graph_exactly(n):
    host_gpu.set_jitter(200)
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(n, _repeat_on_the_same_buffers))
    assert results == [[(0, 0)] * 6] * n, results
    # Per rank: round 0 eager (seen once), round 1 recorded and launched, rounds 2-5 launched;
    # the untagged calls are never recorded.
    calls = host_gpu.calls()
    assert calls["cudaStreamBeginCapture"] == n and calls["cudaGraphLaunch"] == 5 * n, calls
    assert host_gpu.violations() == []


def _groups_per_repeat(comm):
    core, buf = _ring(comm), torch.ones(5000)
    request = _C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, 5000,
                                   _C.DataType.float32, _C.RedOp.sum, replay_tag=0)
    for _ in range(3):
        core.run(request)
    return host_gpu.calls().get("cudaGraphLaunch", 0), float(buf[0])


def test_cuda_graphs_off_runs_every_call_eagerly():
    with host_nccl_backend(slice_bytes=1024, slots=2, cuda_graphs=False):
        results = raise_first(run_ranks(2, _groups_per_repeat))
    assert results == [(0, 8.0), (0, 8.0)], results


def test_ctrl_c_ends_a_wait_for_a_stalled_peer():
    """SIGINT while this (main) thread waits on NCCL for a peer that stopped answering:
    KeyboardInterrupt within a fraction of a second, not at the timeout, and the communicator
    refuses further use."""
    import os
    import signal
    import threading

    host_gpu.reset()
    host_gpu.set_stall(1, 0)  # rank 1's groups are taken and never move
    try:
        rings = _two_rings(publish_bytes=0)
    finally:
        host_gpu.set_stall(-1, -1)
    comm = _C.Communicator(0, 2, rings[0].transport, rings[0].reducer, 256)
    buf = torch.ones(1000)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    begun = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            comm.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, 1000,
                                          _C.DataType.float32, _C.RedOp.sum))
            rings[0].synchronize(TIMEOUT)
        waited = time.monotonic() - begun
    finally:
        timer.cancel()
    assert waited < TIMEOUT / 2, f"the wait ended after {waited:.1f} s"
    with pytest.raises(_C.RingcommError, match="interrupted by a signal"):
        comm.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, 1000,
                                      _C.DataType.float32, _C.RedOp.sum))
    for ring in rings:
        ring.release()


# -- the flight record of device calls: they end when their events say so ------------------------

def _recorded_on_device(comm):
    core, count = _ring(comm), 4099
    core.set_trace_buffer(8)
    stream, buf = host_gpu.new_stream(), torch.ones(count)
    core._comm.run(_C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, count,
                                        _C.DataType.float32, _C.RedOp.sum, stream=stream))
    at_return = core.flight_record()[-1]["state"]  # the GPU's work has only been queued
    host_gpu.synchronize_stream(stream)
    return at_return, _settled(core)[-1]


def _settled(core):
    """The flight record once no call is enqueued (the watchdog reads events every 50 ms)."""
    deadline = time.monotonic() + 5
    while any(e["state"] == "enqueued" for e in core.flight_record()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return core.flight_record()


def test_a_device_call_is_enqueued_until_its_event_completes():
    host_gpu.set_jitter(300)
    with host_nccl_backend(slice_bytes=256, slots=2):
        results = raise_first(run_ranks(2, _recorded_on_device))
    for at_return, entry in results:
        assert at_return == "enqueued", results
        assert entry["state"] == "completed" and entry["ended"] >= entry["started"], entry
        assert (entry["name"], entry["count"], entry["algorithm"]) == ("all_reduce", 4099, "ring")


def test_a_device_call_past_the_timeout_is_recorded_as_failed():
    def skipping(comm):
        core = _ring(comm)
        core.set_trace_buffer(4)
        comm.all_reduce(torch.ones(4099))
        if comm.rank == 0:
            comm.all_reduce(torch.ones(4099))  # rank 1 skips it
            with pytest.raises(_C.CommTimeoutError):
                core.ring.synchronize()
        return _settled(core)

    with host_nccl_backend(slice_bytes=1024, slots=4, timeout=TIMEOUT):
        results = raise_first(run_ranks(2, skipping, timeout=TIMEOUT))
    assert [e["state"] for e in results[1]] == ["completed"], results
    first, second = results[0]
    assert first["state"] == "completed" and second["state"] == "failed", results
    assert "all_reduce #1 did not finish within" in second["failure"], second
