"""Which ranks share a host: at set-up every rank publishes the shared memory it reaches and
its host name, and ranks that reach the same ``/dev/shm`` form a host (shared memory joins
them; the network joins hosts). The identity is the kernel's boot id and the device of the
``/dev/shm`` mount, so containers or namespaces with a private ``/dev/shm`` are hosts of their
own even on one machine, and two machines never look alike."""
import fcntl
import os
import socket
import struct
from typing import NamedTuple


def shared_memory_identity():
    """"<boot id>/<device of /dev/shm>": equal for processes that can map each other's
    shared-memory segments."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/dev/shm').st_dev}"
    except OSError:  # no /dev/shm to share: a host of its own
        return f"{socket.gethostname()}/{os.getpid()}"


class Hosts(NamedTuple):
    """The world's ranks grouped by host. Hosts are numbered in order of their lowest rank."""
    rank: int
    ranks: tuple  # per host, its ranks in increasing order
    names: tuple  # per host, its host name (for messages)
    host_of: tuple  # per rank, its host's number
    world: tuple = ()  # per rank, its rank in the world (of(): a group's members); () the same

    @property
    def host(self):
        return self.host_of[self.rank]

    @property
    def local_ranks(self):
        """This rank's host's ranks."""
        return self.ranks[self.host]

    @property
    def local_index(self):
        return self.local_ranks.index(self.rank)

    @property
    def uniform(self):
        """Whether every host has as many ranks (what the two-level collectives need)."""
        return len({len(r) for r in self.ranks}) == 1

    @property
    def cross_ranks(self):
        """The ranks with this rank's local index on every host, in host order (uniform only)."""
        return tuple(ranks[self.local_index] for ranks in self.ranks)

    def of(self, ranks):
        """The hosts of a group of `ranks` (this rank among them), numbered within it."""
        seen = [(str(self.host_of[r]), self.names[self.host_of[r]]) for r in ranks]
        group = grouped(list(ranks).index(self.rank), seen)
        return group._replace(world=tuple(self.world[r] if self.world else r for r in ranks))

    def same_host(self, peer):
        return self.host_of[peer] == self.host

    def label(self, peer):
        """"rank 3 on host1": how messages name a rank (by its rank in the world)."""
        return f"rank {self.world[peer] if self.world else peer} on {self.names[self.host_of[peer]]}"


def exchange(rendezvous):
    """Every rank's host, learnt through the rendezvous (every rank calls it together)."""
    rendezvous.publish("host", f"{shared_memory_identity()} {socket.gethostname()}")
    seen = [rendezvous.read("host", r).decode().split(" ", 1)
            for r in range(rendezvous.world_size)]
    return grouped(rendezvous.rank, seen)


def grouped(rank, seen):
    """Hosts from (identity, host name) per rank."""
    order = list(dict.fromkeys(identity for identity, _ in seen))
    host_of = tuple(order.index(identity) for identity, _ in seen)
    ranks = tuple(tuple(r for r, h in enumerate(host_of) if h == host) for host in range(len(order)))
    names = tuple(seen[members[0]][1] for members in ranks)
    return Hosts(rank, ranks, names, host_of)


def listen_address(ifname=""):
    """The IPv4 address peers on other hosts reach this process at: `ifname`'s when given
    (``RINGCOMM_SOCKET_IFNAME``), else the one this host routes toward the rendezvous
    (``MASTER_ADDR``; nothing is sent), else its host name's."""
    if ifname:
        return _interface_address(ifname)
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, 9))  # a datagram socket's connect only picks the route
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _interface_address(ifname):
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            request = struct.pack("256s", ifname.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)[20:24])
        except OSError as error:
            raise ValueError(f"RINGCOMM_SOCKET_IFNAME={ifname!r}: no IPv4 address on that "
                             f"interface here ({error})") from None
