"""Point-to-point links of the CPU path: one shared-memory channel per ordered pair of ranks,
set up the first time the pair talks, so that a send/recv between two ranks needs no other
rank. The sender creates its channel and publishes the name in the store; the receiver maps it,
removes the name (both ends have it mapped from then on) and says so in the store. A sender
that closes before its receiver has mapped the channel waits for it (with the timeout), as a
torch send waits for its receiver: messages already sent are not lost. Across hosts, a rank on
another host is reached over the communicator's TCP transport instead (across_hosts), which
connects on first use and needs no set-up here."""
import threading

from . import _C


class PeerLinks:
    def __init__(self, rendezvous, comm, options):
        """`comm`: the CPU ring's _C.Communicator, which sends and receives over these links;
        `options`: the communicator's resolved CommOptions (slots and waits as the ring's)."""
        self._rendezvous = rendezvous
        self._links = _C.ShmPeerLinks(rendezvous.rank, rendezvous.world_size, options.slot_bytes,
                                      options.slot_count, options.timeout, options.spin_us,
                                      options.yield_us)
        hosts = getattr(comm, "hosts", None)  # across hosts: a CommunicatorAcrossHosts
        self._remote, self._sockets = set(), None
        if hosts is None:
            comm.set_peer_links(self._links)
        else:
            self._sockets = comm.peer_sockets
            self._remote = {p for p in range(rendezvous.world_size) if not hosts.same_host(p)}
            comm.set_peer_links(_C.RoutedTransport(rendezvous.rank, [
                None if p == rendezvous.rank else self._sockets if p in self._remote
                else self._links for p in range(rendezvous.world_size)]))
        # Separate locks: a receiver waiting for a peer's name must not stop this rank's sender
        # from publishing its own (the peer may be waiting for it).
        self._out_lock, self._in_lock = threading.Lock(), threading.Lock()
        self._created = []  # peers this rank created a channel to

    def to(self, peer):
        """Makes sure the channel to `peer` exists (before sending to it)."""
        with self._out_lock:
            if peer not in self._remote and not self._links.has_outgoing(peer):
                self._rendezvous.publish(f"p2p-to-{peer}", self._links.create_outgoing(peer))
                self._created.append(peer)

    def from_(self, peer):
        """Makes sure the channel from `peer` is mapped (before receiving from it)."""
        self._attach(peer, wait=True)

    def arrived_tag(self, peer):
        """The tag of the next message `peer` sent this rank, if one has arrived, else None;
        maps the channel if the peer has created it, never waits."""
        if peer in self._remote:
            return self._sockets.arrived_tag(peer)
        if not self._attach(peer, wait=False):
            return None
        return self._links.arrived_tag(peer)

    def _attach(self, peer, wait):
        """Maps the channel from `peer`; without `wait`, only if the peer has published it.
        Returns whether it is mapped."""
        if peer in self._remote:
            return True
        with self._in_lock:
            if not self._links.has_incoming(peer):
                key = f"p2p-to-{self._rendezvous.rank}"
                if not wait and not self._rendezvous.published(key, peer):
                    return False
                name = self._rendezvous.read(key, peer).decode()
                self._links.attach_incoming(peer, name)
                self._links.unlink_incoming(peer)
                self._rendezvous.publish(f"p2p-attached-{peer}", b"1")
            return True

    def close(self, failed=False):
        """Waits until every receiver has mapped its channel (unless the communicator failed:
        then peers learn of it through the abort), so that closing unlinks nothing unread."""
        if not failed:
            for peer in self._created:
                self._rendezvous.read(f"p2p-attached-{self._rendezvous.rank}", peer)
        self._created = []
