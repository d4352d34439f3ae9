"""The backend for CPU buffers ("shm+tcp"): on one host a shared-memory ring; across hosts a
ring whose links are shared memory inside a host and TCP between hosts (across_hosts)."""
from ..world import hosts, pinning
from . import across_hosts
from .links import Links
from .shm import shared_memory_ring


def create(rendezvous, options):
    """A _C.Communicator for CPU buffers, configured by resolved CommOptions; every rank of the
    group calls this together."""
    if rendezvous.world_size > 1:
        where = hosts.exchange(rendezvous)
        pinning.pin(rendezvous, where.local_ranks, options.pin_cores)
        if len(where.ranks) > 1:
            return across_hosts.create(rendezvous, options, where)
    return shared_memory_ring(rendezvous, options)


def attach_peer_links(comm, rendezvous, options):
    """The point-to-point links of `comm` (a communicator :func:`create` made), attached to it:
    across hosts the ones made at set-up, where every rank made them together; on one host made
    now, each pair's shared memory when the pair first talks."""
    links = getattr(comm, "peer_links", None) or Links(rendezvous, options, None, "p2p")
    comm.set_peer_links(links.transport)
    return links
