"""The checks every rank makes together before a collective when the options ask for them
(``debug``, ``check_finite``): one small all_gather over the CPU ring, so that every rank
reaches the same verdict and raises together instead of leaving its peers waiting."""
import numpy as np
import torch

from . import _C
from .buffers import FLOATING


def agree(request, data, world_size, debug, check_finite, run_on_cpu):
    """Raises on every rank when ranks asked for different collectives (`debug`) or one's input
    holds NaN/Inf (`check_finite`). `request`: this rank's
    :class:`~ringcomm.request.CollectiveRequest`; `data`: the Buffer of its input on this rank
    (None: it has none); `run_on_cpu(c_request)` runs a ``_C.CollectiveRequest`` on the CPU
    ring. Ranks compare the header the C++ messages carry (``_C.collective_header``), with the
    algorithm asked for (ranks must ask for the same)."""
    first_bad = first_non_finite(data) if check_finite and data is not None else -1
    header = _C.collective_header(request.to_c())
    mine = torch.tensor(header + [first_bad], dtype=torch.int64)
    everyone = torch.empty(world_size * mine.numel(), dtype=torch.int64)
    run_on_cpu(_C.CollectiveRequest(_C.Collective.all_gather, everyone.data_ptr(),
                                    mine.data_ptr(), mine.numel(), _C.DataType.int64))
    rows = everyone.view(world_size, -1).tolist()
    name = request.collective.name
    if debug and any(row[:-1] != header for row in rows):
        described = "; ".join(f"rank {r}: {_C.describe_collective(row[:-1])}"
                              for r, row in enumerate(rows))
        raise _C.MismatchError(f"{name}: ranks called different collectives ({described})")
    bad = [(r, row[-1]) for r, row in enumerate(rows) if row[-1] >= 0]
    if bad:
        where = ", ".join(f"rank {r} at index {i}" for r, i in bad)
        raise FloatingPointError(f"{name}: NaN or Inf in the input of {where}")


def first_non_finite(buf):
    """Index of the first NaN/Inf element, or -1 (integers have none)."""
    if buf.dtype not in FLOATING or buf.numel == 0:
        return -1
    source = buf.source
    if isinstance(source, torch.Tensor):
        bad = torch.nonzero(~torch.isfinite(source.reshape(-1)))
        return int(bad[0]) if bad.numel() else -1
    if hasattr(source, "__cuda_array_interface__"):  # cupy
        import cupy

        bad = cupy.flatnonzero(~cupy.isfinite(source.reshape(-1)))
        return int(bad[0]) if bad.size else -1
    bad = np.flatnonzero(~np.isfinite(np.asarray(source).reshape(-1)))
    return int(bad[0]) if bad.size else -1
