"""The CPU path across hosts: each link runs over what its two ends share.

- The ring every collective can run on: a neighbour on this host over a shared-memory channel,
  one on another host over TCP (``_C.RoutedTransport`` picks per peer).
- all_reduce, reduce_scatter and all_gather, when every host has as many ranks (L > 1): in two
  levels (csrc/core/two_level.cc) over a shared-memory ring of this host's ranks and a TCP ring
  of the ranks with this rank's local index on every host, so that each of a host's ranks
  carries 1/L of the data between hosts.
- Point-to-point: shared memory to a rank on this host, TCP to others (peer_links.PeerLinks).
Every TCP transport listens on ``hosts.listen_address``; connections are made on first use."""
from . import _C, cpu_backend, hosts as hosts_module


class CommunicatorAcrossHosts(_C.Communicator):
    """A ring communicator that also keeps what point-to-point links across hosts use: the
    hosts (``hosts``) and a TCP transport that reaches every rank (``peer_sockets``)."""
    hosts = peer_sockets = None


def create(rendezvous, options, hosts):
    """The CPU _C.Communicator of ranks on several hosts (`hosts`: hosts.exchange's)."""
    rank, size = rendezvous.rank, rendezvous.world_size
    address = hosts_module.listen_address(options.socket_ifname)
    labels = [hosts.label(r) for r in range(size)]
    ring_sockets, peer_sockets = _sockets(rank, size, options, address), _sockets(
        rank, size, options, address)
    rendezvous.publish("sockets", f"{ring_sockets.address} {peer_sockets.address}")
    addresses = [rendezvous.read("sockets", r).decode().split() for r in range(size)]
    ring_sockets.connect([ring for ring, _ in addresses], labels)
    peer_sockets.connect([peer for _, peer in addresses], labels)
    comm = CommunicatorAcrossHosts(rank, size, _ring(rendezvous, options, hosts, ring_sockets),
                                   _C.CpuReducer(), options.slice_bytes or options.slot_bytes,
                                   thresholds=options.thresholds())
    comm.hosts, comm.peer_sockets = hosts, peer_sockets
    if hosts.uniform and len(hosts.local_ranks) > 1:
        local = cpu_backend.shared_memory_ring(
            rendezvous.subgroup(f"host{hosts.host}", hosts.local_ranks), options)
        cross = _socket_ring(rendezvous.subgroup(f"across{hosts.local_index}", hosts.cross_ranks),
                             options, address, [labels[r] for r in hosts.cross_ranks])
        comm.set_levels(local, cross, [list(ranks) for ranks in hosts.ranks])
    return comm


def _sockets(rank, size, options, address):
    return _C.SocketTransport(rank, size, options.socket_slot_bytes, options.slot_count,
                              options.socket_connections, options.timeout, address)


def _ring(rendezvous, options, hosts, sockets):
    """The ring's transport: each neighbour over shared memory when on this host, else TCP."""
    rank, size = rendezvous.rank, rendezvous.world_size
    after, before = (rank + 1) % size, (rank - 1) % size
    shm = None
    if hosts.same_host(after) or hosts.same_host(before):
        shm = _C.ShmPeerLinks(rank, size, options.slot_bytes, options.slot_count,
                              options.timeout, options.spin_us, options.yield_us)
    if hosts.same_host(after):
        rendezvous.publish("ring-shm", shm.create_outgoing(after))
    if hosts.same_host(before):
        shm.attach_incoming(before, rendezvous.read("ring-shm", before).decode())
        shm.unlink_incoming(before)  # both ends have it mapped
    by_peer = [None] * size
    for peer in (after, before):
        by_peer[peer] = shm if hosts.same_host(peer) else sockets
    return _C.RoutedTransport(rank, by_peer)


def _socket_ring(rendezvous, options, address, labels):
    """A _C.Communicator over TCP between the ranks of `rendezvous` (one per host)."""
    rank, size = rendezvous.rank, rendezvous.world_size
    sockets = _sockets(rank, size, options, address)
    rendezvous.publish("socket", sockets.address)
    sockets.connect([rendezvous.read("socket", r).decode() for r in range(size)], labels)
    return _C.Communicator(rank, size, sockets, _C.CpuReducer(),
                           options.slice_bytes or options.socket_slot_bytes,
                           thresholds=options.thresholds())
