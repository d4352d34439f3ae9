"""The CPU backend: a shared-memory ring between the processes of one host."""
import os

from . import _C

# Cache-sized slots: the reduce reads what the previous rank just wrote while it is still in
# cache. RINGCOMM_SHM_SLOT_BYTES and RINGCOMM_SHM_SLOTS fix them; unset, slots() picks them.
SLOT_BYTES = int(os.environ.get("RINGCOMM_SHM_SLOT_BYTES", 0)) or None
SLOT_COUNT = int(os.environ.get("RINGCOMM_SHM_SLOTS", 0)) or None


# How long a waiting rank yields the CPU before it sleeps on a futex (RINGCOMM_YIELD_US).
YIELD_MICROS = int(os.environ.get("RINGCOMM_YIELD_US", 2000))


def spins(world_size):
    """Busy polls before yielding: worth it only when every rank can have a core to itself."""
    if "RINGCOMM_SPINS" in os.environ:
        return int(os.environ["RINGCOMM_SPINS"])
    return 200 if world_size <= len(os.sched_getaffinity(0)) else 0


def slots(world_size):
    """(bytes, count) of each link's slots: 16 x 64 KiB, or 8 x 32 KiB when ranks outnumber
    cores, as ranks that share a core share its L2.

    Measured on 2 cores, 64 MiB fp32 allreduce. 2 ranks, separate launches: 16 x 64 KiB beat
    4 x 256 KiB by ~1.2x (32 KiB to 1 MiB, 4 to 64 slots tried); 8 x 64 KiB was 3-5% faster at
    64 MiB but 8-9% slower at 1 MiB. 4 ranks, two communicators alternating in one run:
    16 x 32 KiB beat 16 x 64 KiB by 6-8%, and 8 x 32 KiB beat that by another 14-16% (1 MiB
    within 3%). Decided from the host's core count, not this process's affinity, so every rank
    of the ring picks the same."""
    crowded = world_size > (os.cpu_count() or 1)
    size = SLOT_BYTES if SLOT_BYTES is not None else (32 if crowded else 64) * 1024
    count = SLOT_COUNT if SLOT_COUNT is not None else (8 if crowded else 16)
    return size, count


def create(rendezvous, slice_bytes=None):
    """A _C.Communicator over shared memory; every rank of the group calls this together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    slot, count = slots(size)
    transport = _C.ShmTransport(rank, size, slot, count, rendezvous.timeout, spins(size),
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
