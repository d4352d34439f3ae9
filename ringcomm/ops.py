"""ReduceOp: the reductions ringcomm supports, and conversion from what users pass."""
import enum

import torch.distributed as dist

from . import _C


# Members from the C++ op table (csrc/include/ringcomm/types.h), upper-case names of its
# lower-case ones: SUM = "sum", and so on.
ReduceOp = enum.Enum("ReduceOp", [(name.upper(), name) for name in _C.RedOp.__members__],
                     module=__name__, qualname="ReduceOp")
ReduceOp.__doc__ = """Reduction operators, named as in ``torch.distributed.ReduceOp``.

Example::

    comm.all_reduce(t, op=ringcomm.ReduceOp.MAX)   # or op="max", or dist.ReduceOp.MAX
"""


# torch.distributed.ReduceOp member names that differ from ours.
_TORCH_NAMES = {"PRODUCT": ReduceOp.PROD}


def torch_reduce_ops():
    """{op name: torch.distributed.ReduceOp} for each ringcomm op torch.distributed has, in
    ReduceOp's order (it has no land or lor)."""
    torch_names = {op: name for name, op in _TORCH_NAMES.items()}
    ops = {op.value: getattr(dist.ReduceOp, torch_names.get(op, op.name), None) for op in ReduceOp}
    return {name: torch_op for name, torch_op in ops.items() if torch_op is not None}


def to_reduce_op(op):
    """ReduceOp from a ReduceOp, a torch.distributed.ReduceOp member, or a lowercase name."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    else:
        name = getattr(op, "name", None)  # torch.distributed.ReduceOp.RedOpType
        if isinstance(name, str):
            found = _TORCH_NAMES.get(name) or ReduceOp.__members__.get(name)
            if found is not None:
                return found
    choices = ", ".join(repr(m.value) for m in ReduceOp)
    raise ValueError(f"unsupported reduction op {op!r}; use a ringcomm.ReduceOp, a "
                     f"torch.distributed.ReduceOp or one of {choices}")


_c_ops = {op: op for op in _C.RedOp.__members__.values()}  # _C's own ops pass through


def to_c_op(op):
    """The _C.RedOp for `op` (cached: this runs on every collective)."""
    try:
        return _c_ops[op]
    except (KeyError, TypeError):
        c_op = _C.RedOp.__members__[to_reduce_op(op).value]
        try:
            _c_ops[op] = c_op
        except TypeError:  # unhashable: fine, just not cached
            pass
        return c_op
