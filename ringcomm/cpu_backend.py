"""The CPU backend: a shared-memory ring between the processes of one host."""
import os

from . import _C

# Cache-sized slots: the reduce reads what the previous rank just wrote while it is still in
# cache. Many of them: with more ranks than cores, a rank that gets the CPU can run far ahead
# before it must wait. Measured on 2 cores at 64 MiB: 16 x 64 KiB beat 4 x 256 KiB by ~1.2x
# with 2 ranks and ~1.5x with 4 (slots of 32 KiB to 1 MiB, 4 to 64 of them, were tried).
# RINGCOMM_SHM_SLOT_BYTES fixes the size; unset, slot_bytes() picks it.
SLOT_BYTES = int(os.environ["RINGCOMM_SHM_SLOT_BYTES"]) if "RINGCOMM_SHM_SLOT_BYTES" in os.environ else None
SLOT_COUNT = int(os.environ.get("RINGCOMM_SHM_SLOTS", 16))


# How long a waiting rank yields the CPU before it sleeps on a futex (RINGCOMM_YIELD_US).
YIELD_MICROS = int(os.environ.get("RINGCOMM_YIELD_US", 2000))


def spins(world_size):
    """Busy polls before yielding: worth it only when every rank can have a core to itself."""
    if "RINGCOMM_SPINS" in os.environ:
        return int(os.environ["RINGCOMM_SPINS"])
    return 200 if world_size <= len(os.sched_getaffinity(0)) else 0


def slot_bytes(world_size):
    """64 KiB, or 32 KiB when ranks outnumber cores: ranks that share a core share its L2 (32 KiB
    measured 6-8% faster with 4 ranks on 2 cores, 2-4% slower with 2). Decided from the host's
    core count, not this process's affinity, so every rank of the ring picks the same size."""
    if SLOT_BYTES is not None:
        return SLOT_BYTES
    return 64 * 1024 if world_size <= (os.cpu_count() or 1) else 32 * 1024


def create(rendezvous, slice_bytes=None):
    """A _C.Communicator over shared memory; every rank of the group calls this together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    slot = slot_bytes(size)
    transport = _C.ShmTransport(rank, size, slot, SLOT_COUNT, rendezvous.timeout, spins(size),
                                YIELD_MICROS)
    if size > 1:
        rendezvous.publish("shm", transport.channel_name)
        # Every rank maps every channel: allgather and broadcast forward messages by reference.
        transport.connect([rendezvous.read("shm", r).decode() for r in range(size)])
        rendezvous.barrier("shm-attached")
        # Every rank has them mapped: after this, /dev/shm holds nothing of ours, whatever
        # happens to any process.
        transport.unlink_names()
    return _C.Communicator(rank, size, transport, _C.CpuReducer(), slice_bytes or slot)
