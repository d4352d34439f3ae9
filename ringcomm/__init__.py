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
from . import ddp
from ._C import CommTimeoutError, MismatchError, PeerError, RingcommError
from .build import build_info
from .c10d.process_group import register as _register_torch_backend
from .communicator import Communicator, init
from .observe.stats import CommStats
from .ops import ReduceOp
from .options import CommOptions
from .point_to_point import P2POp
from .schedule import Schedule, schedule

_register_torch_backend()  # dist.init_process_group("ringcomm") from here on

__all__ = ["CommOptions", "CommStats", "Communicator", "ReduceOp", "RingcommError",
           "CommTimeoutError", "MismatchError", "P2POp", "PeerError", "Schedule", "build_info",
           "ddp", "init", "schedule"]
