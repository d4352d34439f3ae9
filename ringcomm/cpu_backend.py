"""The CPU backend: a shared-memory ring between the processes of one host."""
from . import _C, backends


def create(rendezvous, options):
    """A _C.Communicator over shared memory, configured by resolved CommOptions; every rank of
    the group calls this together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    transport = _C.ShmTransport(rank, size, options.slot_bytes, options.slot_count,
                                options.timeout, options.spin_us, options.yield_us,
                                options.publish_bytes)
    if size > 1:
        rendezvous.publish("shm", transport.channel_name)
        # Every rank maps every channel and publication board: allgather and broadcast forward
        # messages by reference, one-hop algorithms read publications where they were written.
        transport.connect([rendezvous.read("shm", r).decode() for r in range(size)])
        rendezvous.barrier("shm-attached")
        # Every rank has them mapped: after this, /dev/shm holds nothing of ours, whatever
        # happens to any process.
        transport.unlink_names()
    return _C.Communicator(rank, size, transport, _C.CpuReducer(),
                           options.slice_bytes or options.slot_bytes,
                           thresholds=options.thresholds())


backends.register(backends.Backend(
    "cpu-shm", "cpu", lambda rendezvous, index, options, ordinal: create(rendezvous, options),
    available=lambda: True))
