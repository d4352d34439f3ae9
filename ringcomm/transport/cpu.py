"""The CPU backend: a shared-memory ring between the processes of one host; across hosts, a
ring whose links are shared memory inside a host and sockets between hosts (across_hosts)."""
from . import _C, backends, hosts, pinning


def create(rendezvous, options):
    """A _C.Communicator for CPU buffers, configured by resolved CommOptions; every rank of the
    group calls this together."""
    if rendezvous.world_size > 1:
        where = hosts.exchange(rendezvous)
        pinning.pin(rendezvous, where.local_ranks, options.pin_cores)
        if len(where.ranks) > 1:
            from . import across_hosts
            return across_hosts.create(rendezvous, options, where)
    return shared_memory_ring(rendezvous, options)


def shared_memory_ring(rendezvous, options):
    """A _C.Communicator over shared memory between the ranks of `rendezvous`, all on this
    host."""
    rank, size = rendezvous.rank, rendezvous.world_size
    transport = _C.ShmTransport(rank, size, options.slot_bytes, options.slot_count,
                                options.timeout, options.spin_us, options.yield_us,
                                options.publish_bytes)
    if size > 1:
        rendezvous.publish("shm", transport.channel_name)
        names = [rendezvous.read("shm", r).decode() for r in range(size)]
        try:
            # Every rank maps every channel and publication board: allgather and broadcast
            # forward messages by reference, one-hop algorithms read publications where they
            # were written.
            transport.connect(names)
            rendezvous.barrier("shm-attached")
        finally:
            # Every rank has them mapped, or set-up failed (a peer died or never came) and
            # nobody will: after this, /dev/shm holds nothing of ours, whatever happens to any
            # process.
            transport.unlink_names()
    comm = _C.Communicator(rank, size, transport, _C.CpuReducer(),
                           options.slice_bytes or options.slot_bytes,
                           thresholds=options.thresholds())
    comm.set_trace_buffer(options.trace_buffer)
    return comm


backends.register(backends.Backend(
    "cpu-shm", "cpu", lambda rendezvous, index, options, ordinal: create(rendezvous, options),
    available=lambda: True))
