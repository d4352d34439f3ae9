"""Links between pairs of CPU ranks, by kind. A kind says whether it can link two ranks from
what they share (whether they are on one host) and makes its links for a communicator; each
peer is reached by the first kind of :data:`KINDS` that can (NCCL picks a transport per peer the
same way: canConnect). A new transport between CPU processes is its C++ folder, its binding, a
module with its links and a row of :data:`KINDS` (docs/contributing.md, "How to add ...")."""
from dataclasses import dataclass
from typing import Callable

from .. import _C
from .shm import SharedMemoryLinks
from .tcp import SocketLinks


@dataclass(frozen=True)
class LinkKind:
    name: str
    reaches: Callable  # (same_host) -> whether it can link two ranks
    # (rendezvous, options, hosts, key) -> the kind's links: `.transport` (a _C.Transport that
    # reaches any peer), `.slot_bytes`, `.to(peer)` / `.from_(peer, wait=True)` (make the pair's
    # link before a send / receive), `.arrived_tag(peer)` and `.close(failed)`.
    make: Callable


# In order of preference: where two kinds can link a pair, the first does.
KINDS = (
    LinkKind("shm", reaches=lambda same_host: same_host, make=SharedMemoryLinks),
    LinkKind("tcp", reaches=lambda same_host: True, make=SocketLinks),
)


def kind_for(same_host):
    for kind in KINDS:
        if kind.reaches(same_host):
            return kind
    raise _C.RingcommError(f"no link kind reaches a rank on {'this' if same_host else 'another'} "
                           f"host (kinds: {[k.name for k in KINDS]})")


class Links:
    """One rank's links to its peers in one communicator, each of the kind that reaches it.
    `hosts` (hosts.Hosts) groups the ranks; None: all on this host. Across hosts every rank
    builds them together (TCP publishes every rank's address): at the communicator's set-up;
    on one host shared memory makes a pair's link when the pair first talks."""

    def __init__(self, rendezvous, options, hosts, key):
        rank, size = rendezvous.rank, rendezvous.world_size
        several = hosts is not None and len(hosts.ranks) > 1
        shared = hosts is None or any(len(ranks) > 1 for ranks in hosts.ranks)
        # The kinds some pair of the world takes: every rank makes the same ones.
        used = ([kind_for(True)] if shared else []) + ([kind_for(False)] if several else [])
        self._made = {}
        for kind in used:
            if kind.name not in self._made:
                self._made[kind.name] = kind.make(rendezvous, options, hosts, key)
        self._by_peer = [None if p == rank else self._made[kind_for(
            hosts is None or hosts.same_host(p)).name] for p in range(size)]
        made = list(self._made.values())
        self.slot_bytes = min(m.slot_bytes for m in made)
        routes = [None if m is None else m.transport for m in self._by_peer]
        # The router's message size and wave are the least of the kinds it holds, and every rank
        # must slice and wave alike: a rank whose peers all take one kind (alone on its host)
        # also holds the others, as its own entry, which nothing is ever sent through.
        unused = [m.transport for m in made if all(m.transport is not t for t in routes)]
        if unused:
            routes[rank] = unused[0]
        self.transport = made[0].transport if len(made) == 1 else _C.RoutedTransport(rank, routes)

    def kinds(self):
        """The kind of link to each rank (None for this rank), by rank."""
        names = {id(made): name for name, made in self._made.items()}
        return [None if m is None else names[id(m)] for m in self._by_peer]

    def to(self, peer):
        self._by_peer[peer].to(peer)

    def from_(self, peer):
        self._by_peer[peer].from_(peer)

    def arrived_tag(self, peer):
        return self._by_peer[peer].arrived_tag(peer)

    def close(self, failed=False):
        for made in self._made.values():
            made.close(failed)
