"""Rendezvous through torch.distributed's Store: ranks publish and read small values
(shared-memory names, NCCL unique ids) under a prefix unique to one communicator and to one
set-up of it (ringcomm.world.epochs: a store may hold what an earlier attempt of the job left)."""
import datetime
import itertools
from collections import defaultdict

import torch.distributed as dist

from .. import _C
from . import epochs

# Communicators built in the same order on every rank get the same number, so their store keys
# match without any extra exchange (the way torch names process groups).
_instances = defaultdict(itertools.count)


def timeout_seconds(timeout):
    """Seconds from a datetime.timedelta, a number, or None (torch's default for its backends)."""
    if timeout is None:
        timeout = dist.default_pg_timeout
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout} s")
    return timeout


class Rendezvous:
    """Rank, world size, timeout and a store private to one communicator.

    Built from a torch.distributed group (``Rendezvous(group, timeout)``) or, where no default
    group exists yet (a torch backend's creator), from a store (:meth:`from_store`)."""

    def __init__(self, group, timeout):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ringcomm needs torch.distributed.init_process_group(...) first: "
                               "it takes rank, world size and the rendezvous store from it "
                               "(or build it with ringcomm.Communicator.from_store)")
        group = group or dist.group.WORLD
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("this process is not a member of the given group")
        name = dist.distributed_c10d._get_process_group_name(group)
        self._setup(dist.distributed_c10d._get_default_store(), name, rank, world_size, timeout)

    @classmethod
    def from_store(cls, store, rank, world_size, timeout=None, name="store", number=None):
        """Every rank passes the same store (or stores that share keys) and name; communicators
        built on one store in the same order on every rank get matching keys. `number`: this
        communicator's number among those named `name` (default: counted by this process,
        which is right when every rank is a process; ranks that are threads of one process
        pass it)."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r} is not a rank of a {world_size}-rank world")
        self = cls.__new__(cls)
        self._setup(store, name, rank, world_size, timeout, number)
        return self

    def _setup(self, store, name, rank, world_size, timeout, number=None):
        self.rank, self.world_size = rank, world_size
        self.timeout = timeout_seconds(timeout)
        attempt = epochs.attempt()
        if number is None:
            number = next(_instances[name])
        self.label = f"{name}.{number}"  # names this communicator on every rank
        self.store = dist.PrefixStore(f"ringcomm/{name}/{attempt}/{number}/", store)
        if world_size > 1:  # here, where every rank takes part, not at its first key
            what = f"ringcomm communicator {name} #{number} (attempt {attempt})"
            epoch = epochs.agree(self.store, rank, world_size, self.timeout, what)
            self.store = dist.PrefixStore(f"{epoch}/", self.store)

    def subgroup(self, name, ranks):
        """A rendezvous of `ranks` alone (this rank among them, numbered by its place there),
        with keys of its own under `name` (unique among this rendezvous' subgroups)."""
        sub = Rendezvous.__new__(Rendezvous)
        sub.rank, sub.world_size, sub.timeout = list(ranks).index(self.rank), len(ranks), self.timeout
        sub.store = dist.PrefixStore(f"{name}/", self.store)
        sub.label = f"{self.label}/{name}"
        return sub

    def _wait(self, keys, what):
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except Exception as error:  # the store raises its own kinds; name what was awaited
            raise _C.CommTimeoutError(f"rank {self.rank} timed out after {self.timeout} s waiting "
                                      f"for {what} during ringcomm set-up: {error}") from error

    def publish(self, key, value):
        self.store.set(f"{key}/{self.rank}", value)

    def published(self, key, rank):
        """Whether `rank` has published `key` (never waits)."""
        return self.store.check([f"{key}/{rank}"])

    def read(self, key, rank):
        self._wait([f"{key}/{rank}"], f"rank {rank} to publish '{key}'")
        return self.store.get(f"{key}/{rank}")

    def barrier(self, key):
        if self.store.add(f"{key}/arrived", 1) == self.world_size:
            self.store.set(f"{key}/done", b"1")
        self._wait([f"{key}/done"], f"every rank to reach '{key}'")
