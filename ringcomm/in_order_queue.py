"""The queue of a communicator's asynchronous CPU calls: one worker thread runs them in call
order, so a call that returns at once (``async_op=True``, every call DDP's reducer makes) still
reaches the ring after the calls made before it, and a synchronous call made while some are
queued waits behind them."""
import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from . import waiting

# Set on the worker thread while it runs a queued call: calls made from there run at once
# (they are already in order) instead of queueing behind themselves.
_on_worker = threading.local()


def on_worker():
    """Whether the calling thread is a worker running a queued call."""
    return getattr(_on_worker, "active", False)


class InOrderQueue:
    """Calls run on one worker thread (started on first use), each after every call queued
    before it."""

    def __init__(self):
        self._worker = None
        # The last call queued, until a caller finds it done: while it is set, calls made on
        # other threads than the worker must not go straight to the ring.
        self.last = None
        # (name, Unix time queued) of the calls not yet started, oldest first: the flight
        # record's queued calls. The worker starts them in this order.
        self.pending = collections.deque()

    def ahead(self):
        """Whether queued calls are still to run ahead of a call made now on this thread (never
        on the worker itself, whose calls are already in order)."""
        last = self.last
        if last is None or on_worker():
            return False
        if last.done():
            self.last = None  # nothing queued: the hot path may run the next calls directly
            return False
        return True

    def submit(self, result, call, *args, name="a call"):
        """Queues `call(*args)` after every call queued before; returns a torch Future that
        holds `result` once it has run (or its exception). Collectives that `call` makes run at
        once, in its place in the queue. `name`: what the flight record calls it meanwhile."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="ringcomm")
        future = torch.futures.Future()
        self.pending.append((name, time.time()))

        def task():
            self.pending.popleft()  # this call: tasks start in the order they were queued
            _on_worker.active = True
            try:
                call(*args)
                future.set_result(result)
            except Exception as error:  # delivered to whoever waits on the future
                future.set_exception(error)
            finally:
                _on_worker.active = False

        self.last = self._worker.submit(task)
        return future

    def wait_for_queued(self, abort):
        """Waits until every call queued so far has run (at once on the worker itself);
        `abort(why)` runs if the wait is interrupted (see :mod:`ringcomm.waiting`)."""
        last = self.last
        if last is not None and not on_worker():
            waiting.wait(last, abort)

    def close(self):
        """Runs the calls still queued, then stops the worker; idempotent."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
