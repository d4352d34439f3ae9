"""Shared memory between the ranks of one host: the ring every collective runs on, and the
point-to-point links.

The ring: every rank maps every rank's channel and publication board at set-up (allgather and
broadcast forward messages by reference; one-hop algorithms read publications where they were
written).

The links: one channel per ordered pair of ranks, made the first time the pair talks, so that a
send/recv between two ranks needs no other rank. The sender creates its channel and publishes
the name in the store; the receiver maps it, removes the name (both ends have it mapped from
then on) and says so in the store. A sender that closes before its receiver has mapped the
channel waits for it (with the timeout), as a torch send waits for its receiver: messages
already sent are not lost."""
import threading

from .. import _C


def shared_memory_ring(rendezvous, options):
    """A _C.Communicator over shared memory between the ranks of `rendezvous`, all on this
    host; every rank calls it together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    transport = _C.ShmTransport(rank, size, options.slot_bytes, options.slot_count,
                                options.timeout, options.spin_us, options.yield_us,
                                options.publish_bytes)
    if size > 1:
        rendezvous.publish("shm", transport.channel_name)
        names = [rendezvous.read("shm", r).decode() for r in range(size)]
        try:
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


class SharedMemoryLinks:
    def __init__(self, rendezvous, options, hosts, key):
        """`options`: resolved CommOptions (slots and waits as the ring's); `key` names this
        set of links in the store (a communicator's point-to-point links, its ring's)."""
        self._rendezvous, self._key = rendezvous, key
        self.transport = _C.ShmPeerLinks(rendezvous.rank, rendezvous.world_size,
                                         options.slot_bytes, options.slot_count, options.timeout,
                                         options.spin_us, options.yield_us)
        self.slot_bytes = options.slot_bytes
        # Separate locks: a receiver waiting for a peer's name must not stop this rank's sender
        # from publishing its own (the peer may be waiting for it).
        self._out_lock, self._in_lock = threading.Lock(), threading.Lock()
        self._created = []  # peers this rank created a channel to

    def to(self, peer):
        """Makes sure the channel to `peer` exists (before sending to it)."""
        with self._out_lock:
            if not self.transport.has_outgoing(peer):
                self._rendezvous.publish(f"{self._key}-to-{peer}",
                                         self.transport.create_outgoing(peer))
                self._created.append(peer)

    def from_(self, peer, wait=True):
        """Maps the channel from `peer`; without `wait`, only if the peer has published it.
        Returns whether it is mapped."""
        with self._in_lock:
            if not self.transport.has_incoming(peer):
                key = f"{self._key}-to-{self._rendezvous.rank}"
                if not wait and not self._rendezvous.published(key, peer):
                    return False
                name = self._rendezvous.read(key, peer).decode()
                self.transport.attach_incoming(peer, name)
                self.transport.unlink_incoming(peer)
                self._rendezvous.publish(f"{self._key}-attached-{peer}", b"1")
            return True

    def arrived_tag(self, peer):
        """The tag of the next message `peer` sent this rank, if one has arrived, else None;
        maps the channel if the peer has created it, never waits."""
        return self.transport.arrived_tag(peer) if self.from_(peer, wait=False) else None

    def close(self, failed=False):
        """Waits until every receiver has mapped its channel (unless the communicator failed:
        then peers learn of it through the abort), so that closing unlinks nothing unread."""
        if not failed:
            for peer in self._created:
                self._rendezvous.read(f"{self._key}-attached-{self._rendezvous.rank}", peer)
        self._created = []
