"""Waiting for a call another thread runs (the communicator's worker, the backend's send and
receive threads) so that Ctrl-C still reaches the waiter.

A blocking ``torch.futures.Future.wait()`` holds the main thread in C++, where Python's signal
handlers cannot run: Ctrl-C would do nothing until the call ended, and then the process could
not exit while the worker thread went on waiting for a stalled peer. Here the main thread waits
on a ``threading.Event``, which Python interrupts to run handlers; when one raises
(``KeyboardInterrupt``, or ``SystemExit`` from a SIGTERM handler) the communicator is aborted,
so the thread running the call stops waiting and the peers get a ``PeerError`` naming this
rank, and the exception goes on up."""
import concurrent.futures
import threading

# A signal handled by another thread than the waiting one does not interrupt its wait: it looks
# again this often, which bounds the delay.
_LOOK_EVERY_S = 0.1


def wait(future, abort):
    """The result of `future` (a ``torch.futures.Future`` or a ``concurrent.futures.Future``),
    raising its exception, as its own wait does; `abort(why)` runs first if the wait is
    interrupted, then the interruption propagates."""
    if not future.done():
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        try:
            while not done.wait(_LOOK_EVERY_S):
                pass
        except BaseException as interruption:
            abort(f"interrupted ({type(interruption).__name__}) while waiting for an "
                  "asynchronous call to finish")
            raise
    if isinstance(future, concurrent.futures.Future):
        return future.result()
    return future.wait()
