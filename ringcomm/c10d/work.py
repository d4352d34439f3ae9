"""The Works the torch backend returns: a call that has run, one that runs on another thread,
one ordered on a CUDA stream."""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .. import waiting


def completed(result):
    """The Work of a call that has run (CPU) or has been enqueued on the current stream (CUDA)."""
    device = next((t.device for t in result if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if device is not None:
        return CudaWork(result, device)
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def finish(opts, result):
    """None for a synchronous call from Python; a completed Work otherwise (C++ callers, whose
    options default to asyncOp=True, always get one)."""
    return completed(result) if opts is None or opts.asyncOp else None


class FutureWork(dist._Work):
    """The Work of a call run on another thread (the worker, a send or receive thread) or held
    in a point-to-point batch: wait() raises what the call raised (a Work made by torch from a
    Future returns True from wait() even then) and, interrupted by Ctrl-C, aborts the
    communicator (ringcomm.waiting); a completed receive from any source knows its sender's
    rank. `post`: what makes it go out if it has not yet (a batch cut short goes out when one of
    its Works is used). `done()`: the CUDA event recorded after the call on its stream, once
    posted (None on CPU): its Future completes when the call is enqueued, not run."""

    def __init__(self, future, abort, source=None, post=None, done=None):
        super().__init__()
        self._future, self._abort, self._source, self._post = future, abort, source, post
        self._done = done
        self._cpp_future = None  # get_future's

    def wait(self, timeout=None):
        self._posted()
        # Raises the call's exception; on CUDA orders the current stream after the call.
        waiting.wait(self._future, self._abort)
        return True

    def is_completed(self):
        self._posted()
        event = self._done() if self._done is not None else None
        if event is not None and not event.query():
            return False
        return self._future.done()

    def is_success(self):
        if not self.is_completed():
            return False
        try:
            self._future.value()
            return True
        except Exception:
            return False

    def get_future(self):
        self._posted()
        # A Future completed from Python with set_exception holds the exception as its value
        # (Python's wait() raises it): a C++ consumer such as DDP's reducer would take it for
        # the result (and crash reading tensors out of it). An exception raised in a then()
        # callback is a C++ error instead, which every consumer sees (as a RuntimeError naming
        # the original).
        if self._cpp_future is None:
            self._cpp_future = self._future.then(lambda done: done.wait())
        return self._cpp_future

    def _posted(self):
        if self._post is not None:
            self._post()

    def _source_rank(self):
        if not self._source:
            raise RuntimeError("ringcomm backend: only a completed recv from any source knows "
                               "its sender's rank")
        return self._source[0]


class CudaWork(dist._Work):
    """The Work of a call on CUDA tensors, which ran on the caller's current stream, as NCCL's
    Work: wait() makes the caller's current stream wait for it (the host does not block),
    is_completed() asks the GPU, and the Future carries the device so that what is chained on
    it is ordered after the call too."""

    def __init__(self, result, device):
        super().__init__()
        self._done = torch.cuda.Event()
        self._done.record(torch.cuda.current_stream(device))
        self._future = torch.futures.Future(devices=[device])
        self._future.set_result(result)  # records its own event on the current stream

    def wait(self, timeout=None):
        self._future.wait()  # the current stream waits; the host does not
        return True

    def is_completed(self):
        return self._done.query()

    def is_success(self):
        return self.is_completed()

    def synchronize(self):
        self._done.synchronize()

    def get_future(self):
        return self._future
