"""ringcomm: ring collectives for deep-learning training.

Example::

    import torch, torch.distributed as dist, ringcomm
    dist.init_process_group("gloo")
    comm = ringcomm.Communicator()
    t = torch.full((1000,), float(comm.rank))
    comm.all_reduce(t)
"""
try:
    from . import _C
except ImportError as error:  # e.g. importing the source tree, which has no compiled core
    raise ImportError(
        "ringcomm's compiled core (ringcomm._C) is missing here: install the package "
        "(`pip install .`) and import it from outside the source folder, or build in place "
        f"(`python setup.py build_ext --inplace`). Cause: {error}") from error
from . import cpu_backend, cuda_backend  # noqa: F401  each registers its backend (backends.py)
from . import shm_links, tcp_links  # noqa: F401  each registers its link kind, in preference order
from . import ddp
from ._C import CommTimeoutError, MismatchError, PeerError, RingcommError
from .communicator import Communicator
from .ops import ReduceOp
from .options import CommOptions
from .point_to_point import P2POp
from .schedule import Schedule, schedule
from .stats import CommStats
from . import process_group

process_group.register()  # dist.init_process_group("ringcomm") from here on

__all__ = [
    "CommOptions",
    "CommStats",
    "Communicator",
    "ReduceOp",
    "RingcommError",
    "CommTimeoutError",
    "MismatchError",
    "P2POp",
    "PeerError",
    "Schedule",
    "build_info",
    "ddp",
    "init",
    "schedule",
]


def init(group=None, timeout=None, **options):
    """Shorthand for ``ringcomm.Communicator(group, timeout, ...)``.

    Example::

        comm = ringcomm.init(timeout=datetime.timedelta(seconds=60))
    """
    return Communicator(group, timeout, **options)


def build_info():
    """How this ringcomm was built: ``{"cuda": bool, "cuda_archs": [...], "nccl_version": str|None}``.

    Example::

        >>> ringcomm.build_info()["cuda"]
        True
    """
    info = dict(_C.build_info())
    csv = info.pop("cuda_archs_csv")
    info["cuda_archs"] = [a for a in csv.split(",") if a]
    return info
