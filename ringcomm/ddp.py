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
returned Future before it writes the gradients back. On CPU the collective runs on the
communicator's worker thread (``async_op=True``; buckets in the order DDP launches them, which
is the same on every rank) so backward keeps computing while buckets travel; on CUDA it is
enqueued on the current stream and the Future carries the device, so DDP's wait orders its
stream after the collective.
"""
import weakref

import torch
import torch.distributed as dist

from .communicator import Communicator

# Per communicator: how many HookStates were made for it, and the one a bare Communicator state
# stands for. Every rank makes them in the same order, so each gets the same replay tags on
# every rank: buckets of two models on one communicator never share a tag.
_STATES_MADE = weakref.WeakKeyDictionary()
_BARE_STATES = weakref.WeakKeyDictionary()
_TAGS_PER_STATE = 1 << 16  # bucket indices of one model

__all__ = ["HookState", "allreduce_hook", "bf16_hook", "fp16_hook"]


class HookState:
    """The state for ringcomm's DDP hooks: a communicator and how to run CPU buckets.

    Args:
        comm: the ``ringcomm.Communicator`` every rank of the DDP group built.
        async_cpu: reduce CPU buckets on the communicator's worker thread (``async_op=True``) so
            backward overlaps communication (default). With False the hook reduces the bucket
            before it returns.

    Passing a bare ``Communicator`` as the state is the same as one ``HookState(comm)`` made at
    the first bucket. Each model needs its own state: on CUDA a bucket's all_reduce is replayed
    as a graph under a tag its state and index give (``Communicator.all_reduce``'s
    ``replay_tag``), so give each DDP model of a communicator a ``HookState`` of its own, made in
    the same order on every rank.

    Example::

        comm = ringcomm.Communicator()
        state = ringcomm.ddp.HookState(comm, async_cpu=False)
        model.register_comm_hook(state, ringcomm.ddp.allreduce_hook)
    """

    def __init__(self, comm, async_cpu=True):
        if not isinstance(comm, Communicator):
            raise TypeError(f"HookState needs a ringcomm.Communicator, not {type(comm).__name__}")
        self.comm = comm
        self.async_cpu = bool(async_cpu)
        made = _STATES_MADE.get(comm, 0)
        _STATES_MADE[comm] = made + 1
        self.first_replay_tag = made * _TAGS_PER_STATE

    def __repr__(self):
        return f"ringcomm.ddp.HookState({self.comm!r}, async_cpu={self.async_cpu})"


def _resolve(state):
    if isinstance(state, HookState):
        return state
    if isinstance(state, Communicator):
        bare = _BARE_STATES.get(state)
        if bare is None:
            bare = _BARE_STATES[state] = HookState(state)
        return bare
    raise TypeError("ringcomm's DDP hooks take a ringcomm.Communicator or a ringcomm.ddp.HookState "
                    f"as state, not {type(state).__name__} (a process group is for torch's hooks)")


def _wire_options(tensor, wire_dtype):
    # Only float32 buckets are narrowed on the wire: 16-bit buckets travel as they are (and are
    # accumulated in float32 anyway), float64 buckets are kept exact.
    if wire_dtype is None or tensor.dtype != torch.float32:
        return {}
    return {"wire_dtype": wire_dtype}


def _value(future):
    return future.value()


def _allreduce_fut(state, bucket, wire_dtype=None):
    """Averages the bucket's tensor over the ranks in place; a Future that completes with it."""
    state = _resolve(state)
    tensor = bucket.buffer()
    options = _wire_options(tensor, wire_dtype)
    # Every rank has the same buckets, each on the same buffer step after step (DDP rebuilds
    # them once, after the first step): on CUDA a bucket's all_reduce may be replayed as a graph.
    options["replay_tag"] = state.first_replay_tag + bucket.index()
    if tensor.is_cuda or state.async_cpu:
        # CUDA: enqueued on the current stream; the Future carries the device, so DDP's wait
        # orders its stream after the collective. CPU: queued on the communicator's worker
        # thread, in the order DDP launches buckets (the same on every rank).
        future = state.comm.all_reduce(tensor, op="avg", async_op=True, **options).get_future()
        if tensor.is_cuda:
            return future
        # A failed collective's Future holds the exception as its value, which DDP's C++ side
        # would report as "Unable to cast ... to Tensor"; a callback that re-raises it marks
        # the chained Future as failed, so backward raises the collective's own error.
        return future.then(_value)
    state.comm.all_reduce(tensor, op="avg", **options)
    future = torch.futures.Future()
    future.set_result(tensor)
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
    return _allreduce_fut(state, bucket)


def bf16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with bfloat16 on the wire and float32 accumulation at every hop.

    Half the bytes of :func:`allreduce_hook`; the cast and the scaling are fused into the ring's
    steps and the result comes back in the bucket's dtype. Only float32 buckets are narrowed:
    16-bit buckets travel as they are, float64 buckets stay exact.

    Example::

        model.register_comm_hook(ringcomm.ddp.HookState(comm), ringcomm.ddp.bf16_hook)
    """
    return _allreduce_fut(state, bucket, torch.bfloat16)


def fp16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with float16 on the wire and float32 accumulation at every hop.

    Like :func:`bf16_hook` with float16's finer mantissa and narrower range; the scaling by
    1/world_size is applied in float32, so small gradients do not underflow before the sum.

    Example::

        model.register_comm_hook(comm, ringcomm.ddp.fp16_hook)
    """
    return _allreduce_fut(state, bucket, torch.float16)
