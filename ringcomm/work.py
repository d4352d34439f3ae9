"""Work: the handle an ``async_op=True`` collective returns, as in torch.distributed."""
import torch

from . import waiting


class Work:
    """Completion of one collective.

    Example::

        work = comm.all_reduce(t, async_op=True)
        ...                      # overlap other work
        work.wait()              # t holds the result (CUDA: ordered on the current stream)
    """

    def __init__(self, future, abort=None, done=None):
        """`abort(why)`: what stops the call if the wait is interrupted (the communicator's
        :meth:`~ringcomm.Communicator.abort`); None for a Work that is already complete.
        `done`: a CUDA event recorded after the call on its stream (the Future of a call
        enqueued on a stream is complete at once)."""
        self._future, self._abort, self._done = future, abort, done

    def wait(self, timeout=None):
        """Blocks until done (CPU) or orders the current stream after it (CUDA); raises its error.
        Ctrl-C while it blocks aborts the communicator (see :mod:`ringcomm.waiting`)."""
        if self._abort is None:
            self._future.wait()
        else:
            waiting.wait(self._future, self._abort)
        return True

    def is_completed(self):
        """Whether the call has finished: on CUDA, whether the GPU has run it."""
        if self._done is not None:
            return self._done.query()
        return self._future.done()

    def get_future(self):
        """A ``torch.futures.Future`` holding the output tensor."""
        return self._future


def completed(value, device=None):
    """A Work of a call that has run (CPU) or has been enqueued on the current stream (CUDA:
    stream-ordered, so the host need not wait; is_completed asks the GPU)."""
    future = torch.futures.Future(devices=[device]) if device is not None else torch.futures.Future()
    future.set_result(value)
    done = None
    if device is not None and device.type == "cuda":
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
    return Work(future, done=done)
