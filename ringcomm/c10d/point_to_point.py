"""Point-to-point and all-to-all of the torch backend (RingcommBackend's): on CPU over the
communicator's links, each direction on its own thread; on CUDA over the ring's communicator,
ordered on the current stream, a batch_isend_irecv list as one group."""
import contextlib
import inspect
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from .. import waiting
from ..point_to_point import P2POp
from ..transport import backends
from .tensors import Contiguous, concatenated, unflatten_into
from .work import FutureWork, completed, finish


def _on_ring(tensor):
    """Whether point-to-point on this tensor's device goes over the ring's own communicator
    (NCCL: stream-ordered, a send completes only with its receive) rather than CPU links."""
    return backends.for_device(tensor.device.type).p2p_on_ring


# torch.distributed.batch_isend_irecv's code, to recognize the sends and receives it makes.
# torch >= 2.14 brackets the list with start_coalescing/end_coalescing; older torch takes that
# path for its own ProcessGroup class only and runs the list one operation at a time on a
# process group written in Python: there the list in that call's frame is the only sign of
# which sends and receives form one batch.
_BATCH_CODE = inspect.unwrap(dist.batch_isend_irecv).__code__


def _torch_batch():
    """The P2POp list of the torch.distributed.batch_isend_irecv call that the current send or
    receive comes from (a few frames up, through isend or irecv), else None."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code is _BATCH_CODE:
            ops = frame.f_locals.get(_BATCH_CODE.co_varnames[0])  # its first argument
            return ops if isinstance(ops, list) else None
        frame = frame.f_back
    return None


class _RingBatch:
    """Sends and receives over the ring's communicator that go out as one group: those of one
    torch.distributed.batch_isend_irecv call (`source`, its list of P2POps, or the
    _Coalescing block it runs in), or a single one."""

    def __init__(self, source):
        self.source = source
        # How many of the list's operations reach this batch (those on the ring's device); a
        # coalescing block's go out at its end.
        if isinstance(source, _Coalescing):
            self.expected = None
        else:
            self.expected = 1 if source is None else sum(_on_ring(op.tensor) for op in source)
        self.ops, self.results, self.futures, self.copies = [], [], [], []
        self.stream = None  # the current CUDA stream at the first operation
        self.posted = False
        self.done = None  # CUDA: an event recorded on that stream after the batch

    def add(self, kind, tensors, peer, tag):
        """Adds a send or receive; returns the Future its Work completes with."""
        (tensor,) = tensors
        if not self.ops and tensor.is_cuda:
            self.stream = torch.cuda.current_stream(tensor.device)
        buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        if kind == "recv" and buffer is not tensor:
            self.copies.append((tensor, buffer))
        self.ops.append(P2POp(kind, buffer, peer, tag))
        self.results.append(tensors)
        # CUDA: completed with the stream that ran the batch, which wait() then orders after.
        future = (torch.futures.Future(devices=[tensor.device]) if tensor.is_cuda
                  else torch.futures.Future())
        self.futures.append(future)
        return future

    def on_stream(self):
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)


class _Coalescing:
    """The sends and receives between torch's start_coalescing and end_coalescing: their
    Futures, which the block's one Work completes with."""

    def __init__(self):
        self.futures = []
        self.done = None  # CUDA: the batch's event, once posted

    def work(self, abort):
        futures = self.futures
        if not futures:
            return completed([])
        if len(futures) > 1:  # one Future that fails with the first failure
            futures = [torch.futures.collect_all(futures).then(
                lambda done: [f.wait() for f in done.value()])]
        return FutureWork(futures[0], abort, done=lambda: self.done)


class TorchPointToPoint:
    """send, recv, recv_anysource and all-to-all of a :class:`ProcessGroupRingcomm`, which
    delegates them here, on its `communicator`.

    CPU: a send returns once its message is handed over, but a large one waits for the receiver
    to drain it: isend and irecv run on one thread each, so `isend; irecv; wait` works both
    ways. CUDA, as with NCCL: a send completes only together with its matching recv, and sends
    and receives in separate NCCL groups pair in order, so two ranks that both send first wait
    for each other (at their first exchange, which connects, and for large messages). Exchange
    with dist.batch_isend_irecv: its sends and receives go out as one NCCL group."""

    def __init__(self, communicator):
        self.communicator = communicator
        self._p2p_threads, self._p2p_last = None, {}
        self._batch = None  # a batch_isend_irecv's operations on the ring, until its last one
        self._coalescing = None  # between start_batch and end_batch

    def start_batch(self):
        """torch's start_coalescing: what follows, until end_batch, is one batch."""
        self._coalescing = _Coalescing()

    def end_batch(self):
        """torch's end_coalescing: posts the batch; its Work completes when all of it has."""
        coalescing, self._coalescing = self._coalescing, None
        if coalescing is None:
            return completed([])
        if self._batch is not None and self._batch.source is coalescing:
            self._post(self._batch)
        return coalescing.work(self.communicator.abort)

    def send(self, tensors, dst, tag):
        (tensor,) = tensors
        if _on_ring(tensor):
            return self._ring_p2p("send", tensors, dst, tag)
        return self._p2p("send", lambda: self.communicator.send(tensor.contiguous(), dst, tag),
                         tensors)

    def recv(self, tensors, src, tag):
        (tensor,) = tensors
        if _on_ring(tensor):
            return self._ring_p2p("recv", tensors, src, tag)

        def receive():
            with Contiguous(tensor) as buf:
                self.communicator.recv(buf, src, tag)

        return self._p2p("recv", receive, tensors)

    def recv_anysource(self, tensors, tag):
        (tensor,) = tensors
        if _on_ring(tensor):  # as NCCL's backend: its messages carry no sender to match on
            raise NotImplementedError("ringcomm backend: recv from any source (recv without "
                                      "src) is not supported on CUDA tensors: name the sender")
        source = []

        def receive():
            with Contiguous(tensor) as buf:
                source.append(self.communicator.recv_any(buf, tag))

        return self._p2p("recv", receive, tensors, source)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._drain_p2p()  # all-to-all shares the point-to-point links: keep their order
        with Contiguous(output) as out:
            self.communicator.all_to_all(out, input.contiguous(), output_split_sizes,
                                         input_split_sizes)
        return finish(opts, [output])

    def alltoall(self, outputs, inputs, opts=None):
        self._drain_p2p()
        flat_in = concatenated(inputs)
        flat_out = flat_in.new_empty(sum(t.numel() for t in outputs))
        self.communicator.all_to_all(flat_out, flat_in, [t.numel() for t in outputs],
                                     [t.numel() for t in inputs])
        unflatten_into(flat_out, outputs)
        return finish(opts, outputs)

    def shutdown(self, wait=True):
        for pool in (self._p2p_threads or {}).values():
            pool.shutdown(wait=wait)

    def _coalesced(self, future):
        if self._coalescing is not None:
            self._coalescing.futures.append(future)

    def _ring_p2p(self, kind, tensors, peer, tag):
        """A send or receive over the ring's communicator (NCCL), ordered on the current stream
        (one NCCL communicator must not be driven from two threads). One that
        torch.distributed.batch_isend_irecv makes waits for the rest of its list, which then
        goes out as one NCCL group; any other goes out at once, as NCCL's backend does."""
        source = self._coalescing or _torch_batch()
        batch = self._batch
        if batch is not None and batch.source is not source:
            self._post(batch)  # a list cut short (torch raised inside it): what it has
            batch = None
        if batch is None:
            batch = self._batch = _RingBatch(source)
        future = batch.add(kind, tensors, peer, tag)
        self._coalesced(future)
        if batch.expected is not None and len(batch.ops) >= batch.expected:
            self._post(batch)
        return FutureWork(future, self.communicator.abort, post=lambda: self._post(batch),
                          done=lambda: batch.done)

    def _post(self, batch):
        """Runs a batch as one group, on the stream its first operation was issued on, and
        completes its Works; a failure fails every one of them."""
        if self._batch is batch:
            self._batch = None
        if batch.posted:
            return
        batch.posted = True
        with batch.on_stream():
            try:
                self.communicator.batch_isend_irecv(batch.ops)
                for tensor, buffer in batch.copies:
                    tensor.copy_(buffer)
                if batch.stream is not None:  # is_completed asks the GPU, as NCCL's Work does
                    batch.done = torch.cuda.Event()
                    batch.done.record(batch.stream)
                    if isinstance(batch.source, _Coalescing):
                        batch.source.done = batch.done
            except Exception as error:
                for future in batch.futures:
                    future.set_exception(error)
                raise
            for future, result in zip(batch.futures, batch.results):
                future.set_result(result)

    def _p2p(self, kind, call, tensors, source=None):
        """Runs a send or recv on its own thread; the Work completes when it has."""
        if self._p2p_threads is None:
            self._p2p_threads = {k: ThreadPoolExecutor(1, thread_name_prefix=f"ringcomm-{k}")
                                 for k in ("send", "recv")}
        future = torch.futures.Future()

        def task():
            try:
                call()
                future.set_result(tensors)
            except Exception as error:  # raised by the Work's wait()
                future.set_exception(error)

        self._p2p_last[kind] = self._p2p_threads[kind].submit(task)
        self._coalesced(future)
        return FutureWork(future, self.communicator.abort, source)

    def _drain_p2p(self):
        for pending in self._p2p_last.values():
            waiting.wait(pending, self.communicator.abort)
