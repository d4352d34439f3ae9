"""The CPU backend: a shared-memory ring between the processes of one host."""
import os

from . import _C

# Slots a little larger than a slice fit the L2 cache of common CPUs: the reduce reads what the
# previous rank just wrote while it is still cached.
SLOT_BYTES = int(os.environ.get("RINGCOMM_SHM_SLOT_BYTES", 256 * 1024))
SLOT_COUNT = int(os.environ.get("RINGCOMM_SHM_SLOTS", 4))
SPINS = int(os.environ.get("RINGCOMM_SPINS", 200))


def create(rendezvous, slice_bytes=None):
    """A _C.Communicator over shared memory; every rank of the group calls this together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    transport = _C.ShmTransport(rank, size, SLOT_BYTES, SLOT_COUNT, rendezvous.timeout, SPINS)
    if size > 1:
        rendezvous.publish("shm", transport.channel_name)
        transport.connect(rendezvous.read("shm", (rank - 1) % size).decode())
        # Each name is unlinked by the rank that attaches to it: after this, /dev/shm holds
        # nothing of ours, whatever happens to any process.
        rendezvous.barrier("shm-attached")
    return _C.Communicator(rank, size, transport, _C.CpuReducer(), slice_bytes or SLOT_BYTES)
