"""The real NcclTransport without a GPU: ranks are threads of this process, each with a
ringcomm.Communicator whose CPU tensors go through NcclTransport over the host implementation of
CUDA and NCCL (_testing.host_gpu, csrc/testing/cuda/host_gpu.h) and the CPU reducer launched
on its compute stream. Every collective ends on the calling thread's default stream, which the wrapper
waits for, so a test reads results as on the CPU path."""
import contextlib
import threading
import traceback

import pytest
import torch.distributed as dist

import ringcomm
from ringcomm import _C, _testing
from ringcomm.transport import backends
from ringcomm.world.rendezvous import Rendezvous

if not _C.build_info()["cuda"]:
    pytest.skip("built without CUDA: no NcclTransport to drive", allow_module_level=True)

host_gpu = _testing.host_gpu

# What the core communicator runs on the caller's stream (here its default stream).
_STREAM_ORDERED = {"run", "send", "recv", "send_recv_batch", "all_to_all"}


class _Synchronized:
    """A _C.Communicator over a host-GPU ring whose collectives return once they have run."""

    def __init__(self, comm, ring):
        self._comm, self.ring = comm, ring

    def __getattr__(self, name):
        value = getattr(self._comm, name)
        return _synchronizing(value) if name in _STREAM_ORDERED else value

    def in_place_entry(self, *args):
        """None: Communicator.all_reduce and broadcast keep their methods, which synchronize."""
        return None


def _synchronizing(call):
    def run(*args, **kwargs):
        result = call(*args, **kwargs)
        host_gpu.synchronize_caller()
        return result

    return run


@contextlib.contextmanager
def host_nccl_backend(slice_bytes=256, slots=4, publish_bytes=0, timeout=20.0, cuda_graphs=True):
    """Serves CPU buffers with the host-GPU ring (NcclTransport) instead of shared memory."""

    def create(rendezvous, device_index, options, ordinal=0):
        key = f"host-nccl-id/{ordinal}"
        if rendezvous.rank == 0:
            rendezvous.publish(key, host_gpu.unique_id())
        ring = host_gpu.TransportAndReducer(rendezvous.rank, rendezvous.world_size, rendezvous.read(key, 0),
                             slice_bytes=slice_bytes, slots=slots, publish_bytes=publish_bytes,
                             timeout=timeout, cuda_graphs=cuda_graphs, nccl_sms=options.nccl_sms)
        comm = _C.Communicator(rendezvous.rank, rendezvous.world_size, ring.transport,
                               ring.reducer, slice_bytes)
        comm.set_peer_links(ring.transport)
        return _Synchronized(comm, ring)

    shm = backends.for_device("cpu")
    # Point-to-point on CPU tensors goes over the ring's NcclTransport too, as on CUDA.
    backends.register(backends.Backend("host-nccl", "cpu", create, available=lambda: True,
                                       p2p_on_ring=True))
    host_gpu.reset()
    try:
        yield
    finally:
        backends.register(shm)
        host_gpu.set_stall(-1, -1)
        host_gpu.set_jitter(0)
        host_gpu.set_posts_in_progress(False)


def run_ranks(world, body, timeout=20.0, join_timeout=120.0, **comm_options):
    """Runs body(comm) on `world` threads, one Communicator each; returns per rank the result or
    the exception it raised. A thread still running after join_timeout fails the test (a hang)."""
    store = dist.HashStore()
    results = [None] * world

    def rank_main(rank):
        try:
            # Rendezvous numbers communicators per process, and these ranks share one: each
            # run has a store of its own, and its one communicator is number 0.
            rendezvous = Rendezvous.from_store(store, rank, world, timeout, name="threads",
                                               number=0)
            comm = ringcomm.Communicator(rendezvous, **comm_options)
            try:
                results[rank] = body(comm)
            finally:
                comm.close()
        except Exception as error:  # reported per rank
            error.traceback = traceback.format_exc()
            results[rank] = error

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"ranks {hung} still running after {join_timeout} s: a hang"
    return results


def raise_first(results):
    for rank, result in enumerate(results):
        if isinstance(result, Exception):
            raise AssertionError(f"rank {rank} failed:\n{result.traceback}") from result
    return results
