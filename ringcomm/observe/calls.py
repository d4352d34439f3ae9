"""What users see of ringcomm in the tools they already use.

- **torch.profiler**: while a profiler records, every collective and point-to-point call, of a
  Communicator or of the ``ringcomm`` torch backend, is a range named ``ringcomm:<call>``
  (``ringcomm:all_reduce``, ``ringcomm:send``, ...) on the calling thread, carrying its
  tensors' shapes and dtype and, as torch's own backends record theirs, "Collective name",
  "dtype", "In msg nelems" and "Group size". An asynchronous call's range covers its hand-over
  (DDP's all_reduce of a bucket); calls inside a traced call add no range of their own.
- **logging**: the ``ringcomm`` logger. Nothing is printed by default; ``RINGCOMM_LOG=INFO``
  (the ``log`` option; read when the first communicator is made) prints to stderr one line per
  rank and backend when a communicator sets up (version, build, the link to each peer, the
  algorithm thresholds, slot and slice sizes), ``RINGCOMM_LOG=TRACE`` also one line per call
  (its name, dtype, elements, bytes, the algorithm it ran, time). A handler of the user's own
  gets the same records (TRACE lines only where ``RINGCOMM_LOG=TRACE`` or ``configure("TRACE")`` turned them on: a
  call checks one flag, not the logger).
"""
import functools
import importlib.metadata
import logging
import os
import socket
import sys
import threading
import time

import torch
from torch.autograd import profiler as _torch_profiler

from . import pinning

try:  # records inputs' shapes and keyword fields (torch >= 2.1); a plain named range otherwise
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover
    _Range = None

_inside = threading.local()  # a traced call runs on this thread: calls inside it add nothing
logger = logging.getLogger("ringcomm")
logger.addHandler(logging.NullHandler())
TRACE = 5  # below DEBUG: one line per call
logging.addLevelName(TRACE, "TRACE")
tracing = False  # TRACE lines are on (configure)
_LEVELS = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING}


def configure(level_name):
    """Sets the ringcomm logger's level from the ``log`` option and, once, gives it a stderr
    handler of its own; an empty name leaves logging as the user set it."""
    global tracing
    if not level_name:
        return
    level = _LEVELS.get(level_name.upper())
    if level is None:
        raise ValueError(f"RINGCOMM_LOG={level_name!r}: one of {', '.join(_LEVELS)}")
    logger.setLevel(level)
    tracing = level <= TRACE
    if not any(getattr(h, "ringcomm_stderr", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.ringcomm_stderr = True
        handler.setFormatter(logging.Formatter(
            f"{socket.gethostname()}:{os.getpid()} ringcomm %(levelname)s %(message)s"))
        logger.addHandler(handler)


def traced(name):
    """Decorates a Communicator method: a profiler range and a TRACE line per call, when either
    is wanted (else one check, no other cost). `name`: the call's, or a function of the
    method's positional arguments that gives it."""
    def decorate(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if not wanted():
                return method(self, *args, **kwargs)
            return run(name(args) if callable(name) else name, method, self, args, kwargs)
        return call
    return decorate


def wanted():
    """Whether this call is to be observed: a profiler records or TRACE is on, and no traced
    call of this thread is running it."""
    return (tracing or _torch_profiler._is_profiler_enabled) and not getattr(_inside, "call", False)


def run(name, method, self, args, kwargs):
    """Runs method(self, *args, **kwargs) inside a profiler range (if one records) and logs it
    at TRACE."""
    tensors = [t for a in (*args, *kwargs.values()) for t in _tensors(a)]
    first = tensors[0] if tensors else None
    rank, size = (self.rank(), self.size()) if callable(self.rank) else (self.rank, self.world_size)
    fields = {"Collective name": name, "Group size": size,
              "dtype": str(first.dtype).removeprefix("torch.") if first is not None else "",
              "In msg nelems": first.numel() if first is not None else 0}
    start = time.perf_counter()
    _inside.call = True
    try:
        if _torch_profiler._is_profiler_enabled:
            with _range(name, tensors, fields):
                result = method(self, *args, **kwargs)
        else:
            result = method(self, *args, **kwargs)
    finally:
        _inside.call = False
    if tracing:
        nbytes = first.numel() * first.element_size() if first is not None else 0
        logger.log(TRACE, "rank %d: %s %s x %d (%d B, %s) in %.1f us", rank, name,
                   fields["dtype"], fields["In msg nelems"], nbytes, _algorithm(self),
                   (time.perf_counter() - start) * 1e6)
    return result


def _algorithm(owner):
    """The algorithm of the call just made through `owner` (a Communicator, or the torch
    backend's group), from its backends' newest flight record entry."""
    comm = getattr(owner, "communicator", owner)
    newest = [e for c in list(getattr(comm, "_backends", {}).values())
              for e in c.flight_record(newest=1)]
    last = max(newest, key=lambda e: e["started"], default=None)
    return (last or {}).get("algorithm") or "no algorithm"


def _tensors(arg):
    """The tensors an argument holds: itself, or those of a list (of lists) of them."""
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [t for a in arg for t in _tensors(a)]
    return []


def _range(name, tensors, fields):
    if _Range is not None:
        return _Range(f"ringcomm:{name}", tensors, fields)
    return torch.profiler.record_function(f"ringcomm:{name}")


def _version():
    try:
        return importlib.metadata.version("ringcomm")
    except importlib.metadata.PackageNotFoundError:
        return "(source tree)"


def set_up(comm, device, backend):
    """The INFO line of a communicator's `backend` for `device` buffers, once it is made."""
    if not logger.isEnabledFor(logging.INFO):
        return
    from . import build_info

    options = comm.options
    links = getattr(backend, "peer_links", None)
    kinds = links.kinds() if links is not None else None
    if device == "cpu":
        if kinds is None:  # one host: shared memory to every peer
            kinds = ["shm"] * comm.world_size
        peers = ", ".join(f"{p}:{k}" for p, k in enumerate(kinds) if p != comm.rank)
        sizes = (f"slot {options.slot_bytes} B x {options.slot_count}, slice "
                 f"{options.slice_bytes or options.slot_bytes} B")
    else:
        peers = "nccl to every rank"
        sizes = f"slice {options.slice_bytes or options.cuda_slice_bytes} B"
    thresholds = ", ".join(f"{k} {v}" for k, v in options.thresholds().items())
    cpus = pinning.pinned()
    cores = f"pinned to CPUs {sorted(cpus)}" if cpus else "not pinned"
    logger.info("rank %d/%d: ringcomm %s, build %s; %s: links %s; %s; algorithm %s (%s); %s",
                comm.rank, comm.world_size, _version(), build_info(), device, peers or "none",
                sizes, options.algorithm, thresholds, cores)
