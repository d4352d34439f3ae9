"""ringcomm as a torch.distributed backend: ``dist.init_process_group("ringcomm")``.

``import ringcomm`` registers the backend (see :func:`register`). torch then builds a
:class:`ProcessGroupRingcomm` from its store, rank, world size and timeout, and routes every
collective to it: calls from Python (``dist.all_reduce``) reach these methods directly, calls
from C++ (DDP's reducer, functional collectives) through torch's Python process-group trampoline.

Synchronous calls run on the calling thread and, from Python, return None, which
``torch.distributed`` accepts: nothing is allocated for a Work that would only be waited on.
Asynchronous calls on CPU tensors (``async_op=True``, and every call DDP's reducer makes) are
queued in call order on the communicator's worker thread and return at once, so DDP overlaps
the backward pass with the buckets' all_reduce as it does on gloo; a synchronous call waits for
the queued ones first. CUDA calls are ordered on the current stream instead.

Under torch.compile the methods run as plain Python, never traced (see `_outside_dynamo`).
"""
import contextlib
import inspect
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _C, backends, waiting
from .buffers import cpu_array
from .communicator import Communicator
from .point_to_point import P2POp
from .rendezvous import Rendezvous
from .ops import to_c_op

NAME = "ringcomm"
_ALL_REDUCE, _BROADCAST = _C.Collective.all_reduce, _C.Collective.broadcast

_RedOpType = dist.ReduceOp.RedOpType


def _op(opts, call):
    """_C.RedOp for the options' ReduceOp (SUM without options); PREMUL_SUM (a scaled sum) has
    no ringcomm counterpart."""
    if opts is None:
        return _C.RedOp.sum
    op = opts.reduceOp
    c_op = _C_OPS.get(hash(op))
    if c_op is None:
        raise NotImplementedError(f"ringcomm backend: {call} does not support ReduceOp {op.op}")
    return c_op


def _shared_ops():
    """{hash(torch ReduceOp): _C.RedOp} for every torch op ringcomm has (ops.py's table):
    keyed by hash, as a ReduceOp hashes as its RedOpType's value, while a ReduceOp as a key
    costs ~1 us a lookup in pybind's __eq__."""
    shared = {}
    for kind in _RedOpType.__members__.values():
        try:
            shared[hash(dist.ReduceOp(kind))] = to_c_op(kind)
        except (ValueError, RuntimeError, TypeError):  # PREMUL_SUM, UNUSED: not ringcomm's
            continue
    return shared


_C_OPS = _shared_ops()


def _completed(result):
    """The Work of a call that has run (CPU) or has been enqueued on the current stream (CUDA)."""
    device = next((t.device for t in result if isinstance(t, torch.Tensor) and t.is_cuda), None)
    if device is not None:
        return _CudaWork(result, device)
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _finish(opts, result):
    """None for a synchronous call from Python; a completed Work otherwise (C++ callers, whose
    options default to asyncOp=True, always get one)."""
    return _completed(result) if opts is None or opts.asyncOp else None


def _flat(tensors):
    """One contiguous tensor holding `tensors` back to back."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _unflatten_into(flat, tensors):
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class _Contiguous:
    """A contiguous stand-in for `tensor`, copied back on exit when it had to be a copy."""

    def __init__(self, tensor, write_back=True):
        self.tensor, self.write_back = tensor, write_back
        self.buffer = tensor if tensor.is_contiguous() else tensor.contiguous()

    def __enter__(self):
        return self.buffer

    def __exit__(self, *exc):
        if self.buffer is not self.tensor and self.write_back and exc[0] is None:
            self.tensor.copy_(self.buffer)


def _on_ring(tensor):
    """Whether point-to-point on this tensor's device goes over the ring's own communicator
    (NCCL: stream-ordered, a send completes only with its receive) rather than CPU links."""
    return backends.for_device(tensor.device.type).p2p_on_ring


# torch.distributed.batch_isend_irecv's code, to recognize the sends and receives it makes. On a
# process group written in Python torch runs the list one operation at a time: its coalescing
# path, which brackets the list, is taken for its own ProcessGroup class only. So the list in
# that call's frame is the only sign of which sends and receives form one batch.
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
    torch.distributed.batch_isend_irecv call (`source`, its list of P2POps), or a single one."""

    def __init__(self, source):
        self.source = source
        # How many of the list's operations reach this batch (those on the ring's device).
        self.expected = 1 if source is None else sum(_on_ring(op.tensor) for op in source)
        self.ops, self.results, self.futures, self.copies = [], [], [], []
        self.stream = None  # the current CUDA stream at the first operation
        self.posted = False

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


class ProcessGroupRingcomm(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on a ringcomm Communicator.

    Built by torch for ``init_process_group("ringcomm")`` / ``new_group(backend="ringcomm")``;
    ``self.communicator`` is the underlying :class:`ringcomm.Communicator`, built from the store
    unless one of these ranks is given.
    """

    def __init__(self, store, rank, world_size, timeout, group_name="ringcomm", *,
                 communicator=None):
        super().__init__(rank, world_size)
        if communicator is None:
            # Keys named after the group: ranks outside a sub-group never build it, so a
            # per-process count of communicators would drift between ranks.
            rendezvous = Rendezvous.from_store(store, rank, world_size, timeout, name=group_name)
            communicator = Communicator(rendezvous)
        self.communicator = communicator
        self._all_reduce_algorithm = self.communicator.default_algorithm("all_reduce")
        self._rank, self._world_size = rank, world_size
        self._group_name = self._group_desc = ""
        self._p2p_threads, self._p2p_last = None, {}
        self._batch = None  # a batch_isend_irecv's operations on the ring, until its last one

    # -- identity (FSDP2 and torch's group registry use these) ---------------------------------

    def getBackendName(self):
        return NAME

    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def abort(self):
        # Abort first: close() waits for queued work, which may be waiting for a stalled peer.
        self.communicator.abort("the process group was aborted")
        self.communicator.close()

    def shutdown(self):
        for pool in (self._p2p_threads or {}).values():
            pool.shutdown(wait=True)
        self.communicator.close()

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # The hot path (a contiguous CPU tensor of a supported dtype) goes straight into the
        # C++ ring with nothing allocated on the way, unless the communicator's options ask for
        # more (Communicator.try_run_now); the rest takes the checked route.
        op = _op(opts, "all_reduce")
        comm, algorithm = self.communicator, self._all_reduce_algorithm

        def body():
            for t in tensors:
                fast = cpu_array(t)
                if fast is None or not comm.try_run_now(_ALL_REDUCE, fast[0], 0, fast[1], fast[2],
                                                        op, 0, algorithm):
                    with _Contiguous(t) as c:
                        comm.all_reduce(c, op.name)

        return self._collective(opts, tensors, body)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        comm = self.communicator

        def body():
            for t in tensors:
                fast = cpu_array(t)
                if fast is None or not comm.try_run_now(_BROADCAST, fast[0], 0, fast[1], fast[2],
                                                        _C.RedOp.sum, root):
                    with _Contiguous(t) as c:
                        comm.broadcast(c, root)

        return self._collective(opts, tensors, body)

    def reduce(self, tensors, opts):
        op = _op(opts, "reduce")

        def body():
            for t in tensors:
                with _Contiguous(t) as c:
                    self.communicator.reduce(c, opts.rootRank, op.name)

        return self._collective(opts, tensors, body)

    def all_gather_single(self, output, input, opts=None):
        def body():
            with _Contiguous(output) as out:
                self.communicator.all_gather(out, input.contiguous())

        return self._collective(opts, [output], body)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        def body():
            for output, input in zip(outputs, inputs, strict=True):
                with _Contiguous(output) as out:
                    self.communicator.all_gather(out, input.contiguous())

        return self._collective(opts, outputs, body)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs, strict=True):
            self._check_list(outputs, input, "all_gather", "output_tensor_list")

        def body():
            for outputs, input in zip(output_lists, inputs, strict=True):
                flat = input.new_empty(self._world_size * input.numel())
                self.communicator.all_gather(flat, input.contiguous())
                _unflatten_into(flat, outputs)

        return self._collective(opts, inputs, body, output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        def body():
            flat_in = _flat(inputs)
            flat_out = flat_in.new_empty(self._world_size * flat_in.numel())
            self.communicator.all_gather(flat_out, flat_in)
            for rank, outputs in enumerate(output_lists):  # output_lists[r]: rank r's inputs
                _unflatten_into(flat_out[rank * flat_in.numel():(rank + 1) * flat_in.numel()],
                                outputs)

        return self._collective(opts, inputs, body, output_lists)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts, "reduce_scatter")

        def body():
            with _Contiguous(output) as out:
                self.communicator.reduce_scatter(out, input.contiguous(), op.name)

        return self._collective(opts, [output], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _op(opts, "reduce_scatter")

        def body():
            for output, input in zip(outputs, inputs, strict=True):
                with _Contiguous(output) as out:
                    self.communicator.reduce_scatter(out, input.contiguous(), op.name)

        return self._collective(opts, outputs, body)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op(opts, "reduce_scatter")
        for output, inputs in zip(outputs, input_lists, strict=True):
            self._check_list(inputs, output, "reduce_scatter", "input_list")

        def body():
            for output, inputs in zip(outputs, input_lists, strict=True):
                with _Contiguous(output) as out:
                    self.communicator.reduce_scatter(out, _flat(inputs), op.name)

        return self._collective(opts, outputs, body)

    def gather(self, output_lists, inputs, opts):
        (input,) = inputs
        root = opts.rootRank
        if self._rank == root:
            self._check_list(output_lists[0], input, "gather", "gather_list")

        def body():
            flat = None
            if self._rank == root:
                flat = input.new_empty(self._world_size * input.numel())
            self.communicator.gather(flat, input.contiguous(), root)
            if flat is not None:
                _unflatten_into(flat, output_lists[0])

        return self._collective(opts, inputs, body, output_lists)

    def scatter(self, outputs, input_lists, opts):
        (output,) = outputs
        root = opts.rootRank
        if self._rank == root:
            self._check_list(input_lists[0], output, "scatter", "scatter_list")

        def body():
            flat = _flat(input_lists[0]) if self._rank == root else None
            with _Contiguous(output) as out:
                self.communicator.scatter(out, flat, root)

        return self._collective(opts, outputs, body)

    def barrier(self, opts=None):
        # A barrier is an allreduce of nothing: every rank's first message needs every rank.
        token = torch.zeros(1, dtype=torch.int8)
        self.communicator.all_reduce(token)
        return _completed([token])

    # -- point to point and all-to-all ------------------------------------------------------
    # CPU: a send returns once its message is handed over, but a large one waits for the
    # receiver to drain it: isend and irecv run on one thread each, so `isend; irecv; wait`
    # works both ways.
    # CUDA, as with NCCL: a send completes only together with its matching recv, and sends and
    # receives in separate NCCL groups pair in order, so two ranks that both send first wait for
    # each other (at their first exchange, which connects, and for large messages). Exchange
    # with dist.batch_isend_irecv: its sends and receives go out as one NCCL group.

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
            with _Contiguous(tensor) as buf:
                self.communicator.recv(buf, src, tag)

        return self._p2p("recv", receive, tensors)

    def recv_anysource(self, tensors, tag):
        (tensor,) = tensors
        if _on_ring(tensor):  # as NCCL's backend: its messages carry no sender to match on
            raise NotImplementedError("ringcomm backend: recv from any source (recv without "
                                      "src) is not supported on CUDA tensors: name the sender")
        source = []

        def receive():
            with _Contiguous(tensor) as buf:
                source.append(self.communicator.recv_any(buf, tag))

        return self._p2p("recv", receive, tensors, source)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._drain_p2p()  # all-to-all shares the point-to-point links: keep their order
        with _Contiguous(output) as out:
            self.communicator.all_to_all(out, input.contiguous(), output_split_sizes,
                                         input_split_sizes)
        return _finish(opts, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        self._drain_p2p()
        flat_in = _flat(inputs)
        flat_out = flat_in.new_empty(sum(t.numel() for t in outputs))
        self.communicator.all_to_all(flat_out, flat_in, [t.numel() for t in outputs],
                                     [t.numel() for t in inputs])
        _unflatten_into(flat_out, outputs)
        return _finish(opts, outputs)

    def monitored_barrier(self, *args, **kwargs):
        raise NotImplementedError("ringcomm backend does not support monitored_barrier (a gloo "
                                  "debugging aid); use barrier")

    # -- helpers -------------------------------------------------------------------------------

    def _collective(self, opts, tensors, body, result=None):
        """Runs `body` now, or, for an asynchronous call on CPU tensors (``async_op=True``;
        DDP's reducer and other C++ callers), queued in call order on the communicator's worker
        thread, so the caller goes on (DDP: the backward pass) while it runs. The Work's
        wait() raises what `body` raised; a later synchronous call runs after it."""
        result = tensors if result is None else result
        if opts is not None and opts.asyncOp and tensors and not tensors[0].is_cuda:
            return _FutureWork(self.communicator._submit(body, result), self.communicator.abort)
        body()
        return _finish(opts, result)

    def _ring_p2p(self, kind, tensors, peer, tag):
        """A send or receive over the ring's communicator (NCCL), ordered on the current stream
        (one NCCL communicator must not be driven from two threads). One that
        torch.distributed.batch_isend_irecv makes waits for the rest of its list, which then
        goes out as one NCCL group; any other goes out at once, as NCCL's backend does."""
        source = _torch_batch()
        batch = self._batch
        if batch is not None and batch.source is not source:
            self._post(batch)  # a list cut short (torch raised inside it): what it has
            batch = None
        if batch is None:
            batch = self._batch = _RingBatch(source)
        future = batch.add(kind, tensors, peer, tag)
        if len(batch.ops) >= batch.expected:
            self._post(batch)
        return _FutureWork(future, self.communicator.abort, post=lambda: self._post(batch))

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
        return _FutureWork(future, self.communicator.abort, source)

    def _drain_p2p(self):
        for pending in self._p2p_last.values():
            waiting.wait(pending, self.communicator.abort)

    def _check_list(self, tensors, like, call, what):
        if len(tensors) != self._world_size:
            raise ValueError(f"ringcomm backend: {call} needs {what} of {self._world_size} "
                             f"tensors (one per rank), got {len(tensors)}")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(f"ringcomm backend: {call}: every tensor of {what} must have "
                                 f"{like.numel()} elements of {like.dtype}, got {t.numel()} of "
                                 f"{t.dtype}")


class _FutureWork(dist._Work):
    """The Work of a call run on another thread (the worker, a send or receive thread) or held
    in a point-to-point batch: wait() raises what the call raised (a Work made by torch from a
    Future returns True from wait() even then) and, interrupted by Ctrl-C, aborts the
    communicator (ringcomm.waiting); a completed receive from any source knows its sender's
    rank. `post`: what makes it go out if it has not yet (a batch cut short goes out when one of
    its Works is used)."""

    def __init__(self, future, abort, source=None, post=None):
        super().__init__()
        self._future, self._abort, self._source, self._post = future, abort, source, post
        self._cpp_future = None  # get_future's

    def wait(self, timeout=None):
        self._posted()
        # Raises the call's exception; on CUDA orders the current stream after the call.
        waiting.wait(self._future, self._abort)
        return True

    def is_completed(self):
        self._posted()
        return self._future.done()

    def is_success(self):
        self._posted()
        if not self._future.done():
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


class _CudaWork(dist._Work):
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


def _outside_dynamo(*classes):
    """Runs every method of `classes`, and all it calls, as plain Python under torch.compile.

    While a compiled call runs, Dynamo compiles each Python frame that starts on its thread
    outside torch's own files, also frames that torch's C++ starts. Code that Dynamo runs
    untraced there calls the backend from C++: DDP's forward broadcasts its rebuilt bucket order
    and module buffers and waits on the Works, and so do c10d calls at a graph break
    (dist.barrier, dist.broadcast). gloo's methods are C++ and start no frame. Ours, compiled,
    would read attributes of `self`, a ProcessGroup, which Dynamo treats as an opaque object:
    it fails. (A compiled graph runs with Dynamo off, so its functional collectives never hit
    this.) The code is marked "skip it and what it calls", which is what torch.compiler.disable
    does, without the wrapper that costs every call 0.6-0.8 us; torch without that mark gets the
    wrapper."""
    try:
        from torch._C._dynamo.eval_frame import (_FrameAction, _FrameExecStrategy,
                                                 set_code_exec_strategy)
    except ImportError:
        for cls in classes:
            for name, fn in list(vars(cls).items()):
                if inspect.isfunction(fn):
                    setattr(cls, name, torch.compiler.disable(fn))
        return
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for cls in classes:
        for fn in vars(cls).values():
            if inspect.isfunction(fn):
                set_code_exec_strategy(fn.__code__, skip)


_outside_dynamo(ProcessGroupRingcomm, _FutureWork, _CudaWork)


def _create(options, backend_options):
    """torch's creator (extended API): store, rank, size, timeout and the group's name."""
    return ProcessGroupRingcomm(options.store, options.group_rank, options.group_size,
                                options.timeout, group_name=f"pg-{options.group_id}")


def register():
    """Registers "ringcomm" with torch.distributed (done by ``import ringcomm``); idempotent."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
