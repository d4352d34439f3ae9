"""The ``ringcomm`` logger. Nothing is printed by default; ``RINGCOMM_LOG=INFO`` (the ``log``
option; read when the first communicator is made) prints to stderr one line per rank and backend
when a communicator sets up (version, build, the link to each peer, the algorithm thresholds,
slot and slice sizes), ``RINGCOMM_LOG=TRACE`` also one line per call (:mod:`.calls`: its name,
dtype, elements, bytes, the algorithm it ran, time). A handler of the user's own gets the same
records (TRACE lines only where ``RINGCOMM_LOG=TRACE`` or ``configure("TRACE")`` turned them
on: a call checks one flag, not the logger)."""
import importlib.metadata
import logging
import os
import socket
import sys

from ..build import build_info
from ..options import BY_HOST_COUNT
from ..world import pinning

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


def _version():
    try:
        return importlib.metadata.version("ringcomm")
    except importlib.metadata.PackageNotFoundError:
        return "(source tree)"


def set_up(rank, world_size, options, device, backend):
    """The INFO line of rank `rank`'s `backend` for `device` buffers, once it is made;
    `options`: the communicator's resolved CommOptions."""
    if not logger.isEnabledFor(logging.INFO):
        return
    links = getattr(backend, "peer_links", None)
    kinds = links.kinds() if links is not None else None
    if device == "cpu":
        if kinds is None:  # one host: shared memory to every peer
            kinds = ["shm"] * world_size
        peers = ", ".join(f"{p}:{k}" for p, k in enumerate(kinds) if p != rank)
        sizes = (f"slot {options.slot_bytes} B x {options.slot_count}, slice "
                 f"{options.slice_bytes or options.slot_bytes} B")
    else:
        peers = "nccl to every rank"
        sizes = f"slice {options.slice_bytes or options.cuda_slice_bytes} B"
    thresholds = ", ".join(f"{k} {'by host count' if v == BY_HOST_COUNT else v}"
                           for k, v in options.thresholds().items())
    cpus = pinning.pinned()
    cores = f"pinned to CPUs {sorted(cpus)}" if cpus else "not pinned"
    logger.info("rank %d/%d: ringcomm %s, build %s; %s: links %s; %s; algorithm %s (%s); %s",
                rank, world_size, _version(), build_info(), device, peers or "none",
                sizes, options.algorithm, thresholds, cores)
