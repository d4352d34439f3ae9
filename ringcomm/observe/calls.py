"""Each call, seen in the tools users already have: while a torch.profiler records, every
collective and point-to-point call, of a Communicator or of the ``ringcomm`` torch backend, is
a range named ``ringcomm:<call>`` (``ringcomm:all_reduce``, ``ringcomm:send``, ...) on the
calling thread, carrying its tensors' shapes and dtype and, as torch's own backends record
theirs, "Collective name", "dtype", "In msg nelems" and "Group size". An asynchronous call's
range covers its hand-over (DDP's all_reduce of a bucket); calls inside a traced call add no
range of their own. Where TRACE is on (:mod:`.log`) each call is also a line of the log."""
import functools
import threading
import time

import torch
from torch.autograd import profiler as _torch_profiler

from . import log

try:  # records inputs' shapes and keyword fields (torch >= 2.1); a plain named range otherwise
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover
    _Range = None

_inside = threading.local()  # a traced call runs on this thread: calls inside it add nothing


def traced(name):
    """Decorates a method of a call's owner (a Communicator, the torch backend's group): a
    profiler range and a TRACE line per call, when either is wanted (else one check, no other
    cost). `name`: the call's, or a function of the method's positional arguments that gives
    it."""
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
    return ((log.tracing or _torch_profiler._is_profiler_enabled)
            and not getattr(_inside, "call", False))


def run(name, method, self, args, kwargs):
    """Runs method(self, *args, **kwargs) inside a profiler range (if one records) and logs it
    at TRACE. `self` has ``rank`` and ``world_size`` (or ``rank()`` and ``size()``) and a
    ``flight_record(newest)``, or a ``communicator`` that has one."""
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
    if log.tracing:
        nbytes = first.numel() * first.element_size() if first is not None else 0
        log.logger.log(log.TRACE, "rank %d: %s %s x %d (%d B, %s) in %.1f us", rank, name,
                       fields["dtype"], fields["In msg nelems"], nbytes, _algorithm(self),
                       (time.perf_counter() - start) * 1e6)
    return result


def _algorithm(owner):
    """The algorithm of the call just made through `owner`, from its backends' newest flight
    record entries."""
    record = getattr(owner, "communicator", owner).flight_record(newest=1)
    last = max((e for e in record if e["state"] != "queued"), key=lambda e: e["started"],
               default=None)
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
