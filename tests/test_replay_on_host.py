"""Recorded collectives and the caller's CUDA graphs on the host NCCL (_testing.host_gpu):
what a recording depends on, what a graph of the caller's holds, and the connections a capture
may use. Each check fails on a transport that gets it wrong."""
import threading
import time

import pytest
import torch

from host_gpu_world import host_gpu, host_nccl_backend, raise_first, run_ranks  # noqa: I100

from ringcomm import _C

F32, SUM = _C.DataType.float32, _C.RedOp.sum


def _core(comm):
    return comm._router.communicator_for("cpu", -1)


def _all_reduce(buf, stream=0, tag=-1):
    return _C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, buf.numel(), F32, SUM,
                                stream=stream, replay_tag=tag)


def _sends_per_call(barrier):
    """A tagged all_reduce three times at one slice size, then three times at a smaller one: the
    ncclSend calls each call makes (every rank's), measured between barriers."""
    def body(comm):
        core, r, n = _core(comm), comm.rank, comm.world_size
        buf = torch.zeros(4000)
        sends, wrong = [], 0
        for slice_bytes in (1024, 256):
            core._comm.slice_bytes = slice_bytes
            for _ in range(3):
                barrier.wait()
                before = host_gpu.calls().get("ncclSend", 0)
                barrier.wait()
                buf.fill_(r + 1)
                core.run(_all_reduce(buf, tag=0))
                wrong += int((buf != n * (n + 1) // 2).sum())
                barrier.wait()
                sends.append(host_gpu.calls().get("ncclSend", 0) - before)
        return sends, wrong
    return body


def test_the_slice_size_is_part_of_the_replay_key():
    """Recorded at 1 KiB slices, then asked at 256 B: a new recording, not the old graph (whose
    NCCL operations moved 1 KiB slices)."""
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(2, _sends_per_call(threading.Barrier(2))))
    (sends, wrong), _ = results
    assert [w for _, w in results] == [0, 0]
    large, small = sends[0], sends[3]
    # Eager, recording (its operations posted through NCCL's API), replayed: at each size.
    assert sends == [large, large, 0, small, small, 0], sends
    assert small > large > 0, sends
    assert host_gpu.calls()["cudaStreamBeginCapture"] == 2 * 2
    assert host_gpu.violations() == []


def _tag_on_other_buffers(comm):
    core = _core(comm)
    first, second = torch.ones(500), torch.ones(500)
    for _ in range(2):
        core.run(_all_reduce(first, tag=7))
    with pytest.raises(_C.RingcommError) as raised:
        core.run(_all_reduce(second, tag=7))
    return str(raised.value)


def test_a_tag_on_other_buffers_is_refused_clearly():
    """A tag promises the same buffers from its second call on; breaking it is refused before
    anything is enqueued (on every rank alike here), not replayed on the old buffers."""
    with host_nccl_backend(slice_bytes=256, slots=2):
        results = raise_first(run_ranks(2, _tag_on_other_buffers))
    for message in results:
        assert "replay tag 7 was recorded on other buffers" in message, message


def _capture_one(comm):
    """One all_reduce captured in a graph of the caller's, launched once; the graph handle."""
    core, stream, n = _core(comm), host_gpu.new_stream(), comm.world_size
    buf = torch.ones(300)
    core.run(_all_reduce(buf))  # warm-up: NCCL connects outside the capture
    host_gpu.begin_capture(stream)
    core.run(_all_reduce(buf, stream=stream))
    graph = host_gpu.end_capture(stream)
    buf.fill_(comm.rank + 1)
    host_gpu.launch_graph(graph, stream)
    host_gpu.synchronize_stream(stream)
    assert torch.equal(buf, torch.full((300,), n * (n + 1) / 2))
    return graph, core


def _destroyed_before_close(comm):
    graph, core = _capture_one(comm)
    host_gpu.destroy_graph(graph)
    comm.close()
    core.ring.release()  # the transport goes with its last owner
    return True


def _closed_before_destroyed(comm):
    graph, core = _capture_one(comm)
    comm.close()
    core.ring.release()
    return graph


def _destroyed_communicators():
    return host_gpu.calls().get("ncclCommDestroy", 0) + host_gpu.calls().get("ncclCommAbort", 0)


def test_close_frees_nccl_once_no_graph_of_the_callers_holds_it():
    """A captured collective ties the NCCL communicator to the caller's graph (a CUDA user
    object, as NCCL does): destroyed before close(), close() finalizes at once; closed first,
    the graph's destruction does."""
    with host_nccl_backend(slice_bytes=256, slots=2, timeout=10.0):
        raise_first(run_ranks(2, _destroyed_before_close))
        assert host_gpu.calls().get("ncclCommDestroy", 0) == 2, host_gpu.calls()
        host_gpu.reset()
        graphs = raise_first(run_ranks(2, _closed_before_destroyed))
        assert _destroyed_communicators() == 0, "freed while a graph may still launch it"
        for graph in graphs:
            host_gpu.destroy_graph(graph)
        deadline = time.monotonic() + 10
        while host_gpu.calls().get("ncclCommDestroy", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert host_gpu.calls().get("ncclCommDestroy", 0) == 2, host_gpu.calls()
    assert host_gpu.violations() == []


def _capture_a_receive_from_next(comm):
    """After ring traffic only (sends to next, receives from previous), a receive from next
    has never been connected: a capture must not hold it (NCCL would connect inside it)."""
    core, stream, r, n = _core(comm), host_gpu.new_stream(), comm.rank, comm.world_size
    buf = torch.ones(300)
    core.run(_all_reduce(buf))
    host_gpu.begin_capture(stream)
    try:
        core._comm.recv(buf.data_ptr(), 300, F32, (r + 1) % n, 0, stream)
        error = None
    except _C.RingcommError as raised:
        error = str(raised)
    host_gpu.end_capture(stream)
    return error


def test_a_capture_needs_each_direction_connected_before():
    with host_nccl_backend(slice_bytes=256, slots=2, timeout=5.0):
        results = run_ranks(3, _capture_a_receive_from_next)
    for rank, error in enumerate(results):
        assert isinstance(error, str), results
        assert f"the first receive from rank {(rank + 1) % 3}" in error, error


def _close_after_a_failed_wait(barrier):
    def body(comm):
        core, buf = _core(comm), torch.ones(100)
        core.run(_all_reduce(buf))
        barrier.wait()
        if comm.rank == 0:
            host_gpu.set_synchronize_failure(1)  # cudaErrorInvalidValue, not sticky
        barrier.wait()
        comm.close()
        core.ring.release()  # release(): its streams' waits fail
        barrier.wait()
        if comm.rank == 0:
            host_gpu.set_synchronize_failure(0)
        barrier.wait()
        return host_gpu.last_error()
    return body


def test_a_failed_wait_at_close_leaves_no_error_behind():
    """The next communicator's first launch check would report a stale error as its own."""
    try:
        with host_nccl_backend(slice_bytes=256, slots=2):
            results = raise_first(run_ranks(2, _close_after_a_failed_wait(threading.Barrier(2))))
    finally:
        host_gpu.set_synchronize_failure(0)
    assert results == [0, 0], results
