"""TCP links between ranks anywhere (csrc/tcp/socket_transport.h): every rank listens on one
address (``hosts.listen_address``) and publishes it when the links are made, which every rank
of the communicator does together; a pair's connections are made by the transport itself on its
first message.

Anything on the network can reach a listener, so each set of links has a secret: rank 0 draws
it and publishes it in the rendezvous store (the root of trust, as for torch), every connection's
hello carries it, and a connection without it is dropped (logged at INFO) before it counts."""
import logging
import secrets

from .. import _C
from ..world.hosts import listen_address

logger = logging.getLogger("ringcomm")  # ringcomm.observe.log configures it


class SocketLinks:
    def __init__(self, rendezvous, options, hosts, key):
        rank, size = rendezvous.rank, rendezvous.world_size
        if rank == 0:
            rendezvous.publish(f"{key}-secret", secrets.token_bytes(_C.SECRET_BYTES))
        secret = rendezvous.read(f"{key}-secret", 0)
        self.transport = _C.SocketTransport(
            rank, size, options.socket_slot_bytes, options.slot_count,
            options.socket_connections, options.timeout, listen_address(options.socket_ifname),
            secret, log_drops=logger.isEnabledFor(logging.INFO))
        self.slot_bytes = options.socket_slot_bytes
        rendezvous.publish(f"{key}-tcp", self.transport.address)
        logger.info("rank %d/%d listens for %s links of %s on %s", rank, size, key,
                    rendezvous.label, self.transport.address)
        labels = [f"rank {r}" if hosts is None else hosts.label(r) for r in range(size)]
        self.transport.connect([rendezvous.read(f"{key}-tcp", r).decode() for r in range(size)],
                               labels)

    def to(self, peer):
        pass  # connected on the first message

    def from_(self, peer, wait=True):
        return True  # the peer connects to this rank's listener

    def arrived_tag(self, peer):
        return self.transport.arrived_tag(peer)

    def close(self, failed=False):
        pass  # the transport writes out what was sent before it closes
