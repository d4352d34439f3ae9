"""The backends, by name: each is a transport and a reducer for one kind of memory, registered
for the device whose buffers it serves (``cpu-shm`` for "cpu", ``cuda-nccl`` for "cuda").
A Communicator asks ``for_device(buffer.device)`` and never names a backend module, so a new
transport is its C++ folder, its binding and one module that calls :func:`register`."""
from dataclasses import dataclass
from typing import Callable


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


_BY_NAME, _BY_DEVICE = {}, {}


def register(backend):
    """Makes `backend` the one that serves its device (a later registration replaces it)."""
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
