"""The backends, by device: each is a transport and a reducer for one kind of memory, named for
its mechanism and serving the buffers of one device (:data:`BACKENDS`). A Communicator asks
``for_device(buffer.device)`` and never names a backend module, so a new transport is its C++
folder, its binding, one module with its ``create`` and a row of :data:`BACKENDS`."""
from dataclasses import dataclass
from typing import Callable

from . import cpu, cuda


@dataclass(frozen=True)
class Backend:
    name: str
    device: str  # the buffers' device ("cpu", "cuda") it serves
    # (rendezvous, device_index, options, ordinal) -> _C.Communicator; every rank calls it
    # together; `ordinal` counts the communicator's earlier backends of the same device.
    create: Callable
    available: Callable  # () -> bool: whether this device can be used here (a GPU, NCCL)
    # (buffer) -> the caller's queue of device work as an integer, or None for host backends,
    # whose collectives run on the calling thread (or the worker) and end before they return.
    stream: Callable = lambda buffer: None
    # Whether point-to-point calls go over this backend's own communicator (NCCL reaches every
    # rank), ordered on the caller's stream, with NCCL's pairing: a send completes only together
    # with its matching receive, so an exchange must be posted as one batch. False: they go
    # over the CPU's point-to-point links, where a send returns once its message is handed over.
    p2p_on_ring: bool = False


BACKENDS = (
    # Shared memory between the ranks of a host, TCP between hosts.
    Backend("shm+tcp", "cpu", lambda rendezvous, index, options, ordinal:
            cpu.create(rendezvous, options), available=lambda: True),
    Backend("nccl", "cuda", cuda.create, available=cuda.available, stream=cuda.current_stream,
            p2p_on_ring=True),
)

_BY_NAME = {backend.name: backend for backend in BACKENDS}
_BY_DEVICE = {backend.device: backend for backend in BACKENDS}


def register(backend):
    """Makes `backend` the one that serves its device in this process, in place of the one
    that did (a test's stand-in, a transport being tried)."""
    _BY_NAME[backend.name] = _BY_DEVICE[backend.device] = backend


def for_device(device):
    try:
        return _BY_DEVICE[device]
    except KeyError:
        raise ValueError(f"ringcomm has no backend for {device} buffers (it has: "
                         f"{', '.join(f'{b.name} for {b.device}' for b in _BY_NAME.values())})"
                         ) from None


def registered():
    """{name: Backend} of every registered backend."""
    return dict(_BY_NAME)
