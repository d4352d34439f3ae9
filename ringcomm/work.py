"""Work: the handle an ``async_op=True`` collective returns, as in torch.distributed."""
import torch


class Work:
    """Completion of one collective.

    Example::

        work = comm.all_reduce(t, async_op=True)
        ...                      # overlap other work
        work.wait()              # t holds the result (CUDA: ordered on the current stream)
    """

    def __init__(self, future):
        self._future = future

    def wait(self, timeout=None):
        """Blocks until done (CPU) or orders the current stream after it (CUDA); raises its error."""
        self._future.wait()
        return True

    def is_completed(self):
        return self._future.done()

    def get_future(self):
        """A ``torch.futures.Future`` holding the output tensor."""
        return self._future


def completed(value, device=None):
    """A Work that is already complete (CUDA: stream-ordered, so the host need not wait)."""
    future = torch.futures.Future(devices=[device]) if device is not None else torch.futures.Future()
    future.set_result(value)
    return Work(future)
