"""Argument checks that need no communication: they raise before any rank sends anything,
so a bad call on one rank leaves every buffer untouched and the ring in step."""
from . import _C
from .buffers import as_buffer
from .options import check_algorithm


def writable(array, what):
    buf = as_buffer(array, what)
    if buf.readonly:
        raise ValueError(f"{what} is read-only, but the collective writes into it")
    return buf


_ALGORITHMS = dict(_C.Algorithm.__members__)  # pybind builds __members__ anew on each read


def algorithm(name):
    """The _C.Algorithm for an all_reduce algorithm's name (ringcomm.options.ALGORITHMS)."""
    return _ALGORITHMS[check_algorithm(name)]


def replay_tag(tag):
    """A caller's replay tag: an int >= 0 (see Communicator.all_reduce)."""
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
        raise ValueError(f"replay_tag={tag!r}: an int >= 0, the same on every rank")
    return tag


def root(rank, name, world_size):
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{name}={rank!r} is not a rank of this {world_size}-rank communicator")


def same_kind(out, inp):
    if out.dtype != inp.dtype:
        raise TypeError(f"output has dtype {out.dtype} but input has {inp.dtype}; they must match")
    if (out.device, out.device_index) != (inp.device, inp.device_index):
        raise ValueError(f"output is on {out.device} but input is on {inp.device}; they must match")


def sizes(actual, expected, what, rule):
    if actual != expected:
        raise ValueError(f"{what} has {actual} elements but must have {rule} = {expected}")


def aliasing(out, inp, in_place_address, inp_inside_out=False):
    """Input and output may only overlap as the in-place form: this rank's block."""
    if not out.overlaps(inp):
        return
    small = inp if inp_inside_out else out
    if small.address == in_place_address:
        return
    raise ValueError("input and output overlap; the only overlap allowed is the in-place "
                     "form where the smaller one is exactly this rank's block of the larger")
