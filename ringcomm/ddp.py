"""DDP communication hooks that average gradient buckets over ringcomm's ring.

Register one on a ``DistributedDataParallel`` model with a ``ringcomm.Communicator`` (or a
:class:`HookState` holding one) as the state::

    model.register_comm_hook(comm, ringcomm.ddp.allreduce_hook)

- :func:`allreduce_hook`: the mean over ranks, exact as plain DDP; the 1/world_size scaling is
  fused into the last reduction step of the ring (no separate division pass).
- :func:`bf16_hook`, :func:`fp16_hook`: 16-bit messages on the wire (half the bytes), float32
  accumulation at every hop and the result back in the bucket's dtype. They are more accurate
  than torch's ``bf16_compress_hook``/``fp16_compress_hook``, which round each rank's gradient and
  every partial sum to 16 bits. (Not named ``bf16_compress_hook``: DDP refuses a hook of that
  name unless CUDA and NCCL are present.)

DDP hands the hooks a bucket whose gradients are summed, not yet averaged, and waits on the
returned Future before it writes the gradients back. On CPU the collective runs on a worker
thread (one per state, buckets in the order DDP launches them, which is the same on every rank)
so backward keeps computing while buckets travel; on CUDA it is enqueued on the current stream
and the Future carries the device, so DDP's wait orders its stream after the collective.
"""
import queue
import threading
import weakref

import torch
import torch.distributed as dist

from .communicator import Communicator

__all__ = ["HookState", "allreduce_hook", "bf16_hook", "fp16_hook"]


class HookState:
    """The state for ringcomm's DDP hooks: a communicator and how to run it on CPU buckets.

    Args:
        comm: the ``ringcomm.Communicator`` every rank of the DDP group built.
        async_cpu: run CPU buckets on a worker thread so backward overlaps communication
            (default). With False the hook reduces the bucket before it returns.

    Passing a bare ``Communicator`` as the state is the same as ``HookState(comm)``. Call
    :meth:`close` (or use ``with``) to stop the worker thread; the communicator stays open.

    Example::

        comm = ringcomm.Communicator()
        state = ringcomm.ddp.HookState(comm, async_cpu=True)
        model.register_comm_hook(state, ringcomm.ddp.allreduce_hook)
        ...
        state.close()
        comm.close()
    """

    def __init__(self, comm, async_cpu=True):
        if not isinstance(comm, Communicator):
            raise TypeError(f"HookState needs a ringcomm.Communicator, not {type(comm).__name__}")
        self.comm = comm
        self.async_cpu = bool(async_cpu)
        self._worker = None

    def close(self):
        """Stops the worker thread after the buckets already queued; the communicator stays open."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ringcomm.ddp.HookState({self.comm!r}, async_cpu={self.async_cpu})"

    def _submit(self, fn):
        if self._worker is None or not self._worker.alive():
            self._worker = _Worker()
        return self._worker.submit(fn)


class _Worker:
    """One thread that runs queued calls in order and completes a Future for each.

    The thread holds only the queue, so a forgotten HookState still lets it end: the finalizer
    sends the stop sentinel when the _Worker is collected."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=_Worker._loop, args=(self._queue,),
                                         name="ringcomm-ddp-hook", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, self._queue.put, None)

    def alive(self):
        # False in a child forked after the thread started: the thread did not come along.
        return self._thread.is_alive()

    def submit(self, fn):
        future = torch.futures.Future()
        self._queue.put((fn, future))
        # set_exception only stores the exception as the value (DDP's C++ side would then fail
        # with "Unable to cast ... to Tensor"); a callback that re-raises it marks the chained
        # Future as failed, so backward raises the collective's own error.
        return future.then(_value)

    def stop(self):
        self._finalizer()  # puts the sentinel once
        if self._thread is not threading.current_thread():
            self._thread.join()

    @staticmethod
    def _loop(work):
        while True:
            item = work.get()
            if item is None:
                return
            fn, future = item
            try:
                result = fn()
            except Exception as error:  # DDP's wait re-raises it in backward
                future.set_exception(error)
            else:
                future.set_result(result)
            del item, fn, future  # release the bucket before waiting for the next one


def _value(future):
    return future.value()


# Workers for hooks registered with a bare Communicator, so they overlap too. The worker holds
# no reference to the communicator, so the entry goes when the communicator does.
_default_workers = weakref.WeakKeyDictionary()


def _resolve(state):
    """(communicator, async_cpu, submit) for a hook's state."""
    if isinstance(state, HookState):
        return state.comm, state.async_cpu, state._submit
    if isinstance(state, Communicator):
        def submit(fn):
            worker = _default_workers.get(state)
            if worker is None or not worker.alive():
                worker = _default_workers[state] = _Worker()
            return worker.submit(fn)
        return state, True, submit
    raise TypeError("ringcomm's DDP hooks take a ringcomm.Communicator or a ringcomm.ddp.HookState "
                    f"as state, not {type(state).__name__} (a process group is for torch's hooks)")


def _wire_options(tensor, wire_dtype):
    # A bucket already in 16 bits travels as it is (ringcomm accumulates it in float32 anyway);
    # only wider buckets are narrowed on the wire.
    if wire_dtype is None or tensor.element_size() <= 2:
        return {}
    return {"wire_dtype": wire_dtype}


def _allreduce_fut(state, tensor, wire_dtype=None):
    """Averages ``tensor`` over the ranks in place; a Future that completes with it."""
    comm, async_cpu, submit = _resolve(state)
    options = _wire_options(tensor, wire_dtype)

    def reduce():
        comm.all_reduce(tensor, op="avg", **options)
        return tensor

    if tensor.is_cuda:
        # The collective is enqueued on the current stream; a Future that knows the device
        # records an event there on set_result, and DDP's wait makes its stream wait for it.
        future = torch.futures.Future(devices=[tensor.device])
        future.set_result(reduce())
        return future
    if async_cpu:
        return submit(reduce)
    future = torch.futures.Future()
    future.set_result(reduce())
    return future


def allreduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over all ranks through ringcomm's ring: the same result as plain DDP.

    ``state`` is a ``ringcomm.Communicator`` or a :class:`HookState`. The 1/world_size scaling
    happens inside the last reduction step, so there is no separate division pass.

    Example::

        comm = ringcomm.Communicator()
        model = DistributedDataParallel(net)
        model.register_comm_hook(comm, ringcomm.ddp.allreduce_hook)
    """
    return _allreduce_fut(state, bucket.buffer())


def bf16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with bfloat16 on the wire and float32 accumulation at every hop.

    Half the bytes of :func:`allreduce_hook`; the cast and the scaling are fused into the ring's
    steps and the result comes back in the bucket's dtype. Buckets already in 16 bits travel
    as they are.

    Example::

        model.register_comm_hook(ringcomm.ddp.HookState(comm), ringcomm.ddp.bf16_hook)
    """
    return _allreduce_fut(state, bucket.buffer(), torch.bfloat16)


def fp16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with float16 on the wire and float32 accumulation at every hop.

    Like :func:`bf16_hook` with float16's finer mantissa and narrower range; the scaling by
    1/world_size is applied in float32, so small gradients do not underflow before the sum.

    Example::

        model.register_comm_hook(comm, ringcomm.ddp.fp16_hook)
    """
    return _allreduce_fut(state, bucket.buffer(), torch.float16)
