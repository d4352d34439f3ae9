"""torch's ReduceOp options as ringcomm's _C.RedOp."""
import torch.distributed as dist

from .. import _C
from ..ops import to_c_op

_RedOpType = dist.ReduceOp.RedOpType


def c_op(opts, call):
    """_C.RedOp for the options' ReduceOp (SUM without options); PREMUL_SUM (a scaled sum) has
    no ringcomm counterpart."""
    if opts is None:
        return _C.RedOp.sum
    op = opts.reduceOp
    found = _C_OPS.get(hash(op))
    if found is None:
        raise NotImplementedError(f"ringcomm backend: {call} does not support ReduceOp {op.op}")
    return found


def _shared_ops():
    """{hash(torch ReduceOp): _C.RedOp} for every torch op ringcomm has (ops.py's table):
    keyed by hash, as a ReduceOp hashes as its RedOpType's value, while a ReduceOp as a key
    costs ~1 us a lookup in pybind's __eq__."""
    shared = {}
    for kind in _RedOpType.__members__.values():
        try:
            shared[hash(dist.ReduceOp(kind))] = to_c_op(kind)
        except (ValueError, RuntimeError, TypeError):  # PREMUL_SUM, UNUSED: not ringcomm's
            continue
    return shared


_C_OPS = _shared_ops()
