"""The CPU path across hosts: each link runs over what its two ends share (ringcomm.transport.links:
shared memory inside a host, TCP between hosts).

- The ring every collective can run on: links to its two neighbours, each of its own kind
  (``_C.RoutedTransport`` hands each to the transport for its peer).
- all_reduce, reduce_scatter and all_gather, when every host has as many ranks (L > 1): in two
  levels (csrc/core/two_level.cc) over a shared-memory ring of this host's ranks and a TCP ring
  of the ranks with this rank's local index on every host, so that each of a host's ranks
  carries 1/L of the data between hosts. Hosts of unequal rank counts: in two levels through
  each host's first rank (its leader), the only one that joins the TCP level
  (csrc/core/two_level_uneven.cc): all_reduce, and reduce_scatter and all_gather where that
  sends fewer bytes between hosts than the flat ring.
- Point-to-point: links to every peer, made here since TCP's are made by every rank together."""
from .. import _C
from .links import Links
from .shm import shared_memory_ring


class CommunicatorAcrossHosts(_C.Communicator):
    """A ring communicator that also keeps its point-to-point links (``peer_links``, a
    ringcomm.transport.links.Links), which across hosts are made at set-up."""
    peer_links = None


def create(rendezvous, options, hosts):
    """The CPU _C.Communicator of ranks on several hosts (`hosts`: hosts.exchange's)."""
    comm = _ring(rendezvous, options, hosts, CommunicatorAcrossHosts)
    comm.peer_links = Links(rendezvous, options, hosts, "p2p")
    if not hosts.uniform or len(hosts.local_ranks) > 1:
        local = shared_memory_ring(rendezvous.subgroup(f"host{hosts.host}", hosts.local_ranks),
                                   options)
        if hosts.uniform:
            cross = _ring(rendezvous.subgroup(f"across{hosts.local_index}", hosts.cross_ranks),
                          options, hosts.of(hosts.cross_ranks))
        else:  # uneven: the hosts' leaders alone
            leaders = tuple(ranks[0] for ranks in hosts.ranks)
            cross = None if hosts.local_index else _ring(
                rendezvous.subgroup("leaders", leaders), options, hosts.of(leaders))
        leaders = {"auto": None, "on": True, "off": False}[options.uneven_leaders]
        comm.set_levels(local, cross, [list(ranks) for ranks in hosts.ranks], leaders)
    return comm


def _ring(rendezvous, options, hosts, make=_C.Communicator):
    """A ring communicator whose link to each neighbour is of the kind that reaches it."""
    rank, size = rendezvous.rank, rendezvous.world_size
    ring = Links(rendezvous, options, hosts, "ring")
    ring.to((rank + 1) % size)  # never waits; then wait for the neighbour before to make its own
    ring.from_((rank - 1) % size)
    comm = make(rank, size, ring.transport, _C.CpuReducer(), options.slice_bytes or ring.slot_bytes,
                thresholds=options.thresholds())
    comm.set_trace_buffer(options.trace_buffer)
    return comm
