"""ringcomm as a torch.distributed backend: ``dist.init_process_group("ringcomm")``.

``import ringcomm`` registers the backend (see :func:`register`). For each group torch calls
:func:`_create` with the group's store, rank, size and timeout. On torch >= 2.14 that builds a
:class:`RingcommGroup`: a torch ``ProcessGroup`` whose calls go through c10d's dispatch (and its
hooks: the flight recorder, coalescing, reconfigure) to one :class:`RingcommBackend` registered
for "cpu" and "cuda". On older torch the backend is the process group itself.
"""
import sys

import torch
import torch.distributed as dist

from .backend import NAME, RingcommBackend
from .capabilities import BACKEND_PER_DEVICE
from .dynamo import outside_dynamo

DEVICES = ("cpu", "cuda")

# The calls that return a Work: the group runs them on its backend itself. A Work that a
# backend written in Python returns through c10d's dispatch reaches the caller wrapped by torch
# in one that forwards only wait() and get_future(): is_completed() would stay False for good
# (a caller polling it would hang) and a receive from any source could not tell its sender.
_CALLS_WITH_WORK = (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "all_gather_single",
    "_allgather_base", "allgather_coalesced", "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "all_to_all_single", "send",
    "recv", "recv_anysource", "barrier", "monitored_barrier")


def _on_backend(name):
    def call(self, *args, **kwargs):
        return getattr(self.backend, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class RingcommGroup(dist.ProcessGroup):
    """A torch ``ProcessGroup`` over one :class:`RingcommBackend` for every device type.

    It is torch's own class but for rank and size, which it reads from the backend: a
    reconfigure renumbers them, and torch's ``Backend`` keeps the numbers it was built with."""

    def __init__(self, store, backend):
        rank, size = backend.rank_and_size
        super().__init__(store, rank, size)
        self.backend = backend
        custom = dist.ProcessGroup.BackendType.CUSTOM
        for device in DEVICES:
            self._register_backend(torch.device(device), custom, backend)
        self._set_default_backend(custom)

    def getBackendName(self):
        return NAME

    def getRank(self):
        return self.backend.rank_and_size[0]

    def getSize(self):
        return self.backend.rank_and_size[1]

    # torch's coalescing manager (batch_isend_irecv's) brackets its calls with these.
    def _start_coalescing(self, device):
        self.backend.start_coalescing()

    def _end_coalescing(self, device):
        return self.backend.end_coalescing()

    locals().update({name: _on_backend(name) for name in _CALLS_WITH_WORK})


outside_dynamo(RingcommGroup)


def backend_of(group=None):
    """The :class:`RingcommBackend` of a ringcomm group (default: the default group)."""
    group = group or dist.group.WORLD
    backend = group.backend if isinstance(group, RingcommGroup) else group
    if not isinstance(backend, RingcommBackend):
        raise TypeError(f"{group!r} is not a ringcomm process group")
    return backend


def group_over(backend, store):
    """The torch process group whose calls `backend` runs (on torch < 2.14: itself)."""
    return RingcommGroup(store, backend) if BACKEND_PER_DEVICE else backend


def _refuse_mixed_backends():
    """Raises for a group that asks for ringcomm on some devices and another backend on others
    ("cpu:ringcomm,cuda:gloo"): torch takes the process group ringcomm builds for all of them.
    The device map is only in the frame that calls the creator (torch's group factory)."""
    config = sys._getframe(2).f_locals.get("backend_config")
    backends = set(config.get_device_backend_map().values()) if config is not None else set()
    if len(backends) > 1:
        raise ValueError(f"ringcomm serves every device of its group: backend '{config}' mixes it "
                         "with another; make one group per backend (dist.new_group(backend=...))")


def _create(options, backend_options):
    """torch's creator (extended API): store, rank, size, timeout and the group's name."""
    _refuse_mixed_backends()
    configured = not getattr(options, "enable_reconfigure", False)
    backend = RingcommBackend(options.store, options.group_rank, options.group_size,
                              options.timeout, group_name=f"pg-{options.group_id}",
                              configured=configured)
    return group_over(backend, options.store)


def register():
    """Registers "ringcomm" with torch.distributed (done by ``import ringcomm``); idempotent."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=list(DEVICES))
