"""The collectives of the ringcomm torch backend, on one :class:`ringcomm.Communicator`.

torch builds its own backends as a ``ProcessGroup`` that dispatches each call, by the tensors'
device type, to a ``Backend``: :class:`RingcommBackend` is ringcomm's, registered for "cpu" and
"cuda" (ringcomm.c10d.process_group). torch before 2.14 cannot build a ``Backend`` written in
Python; there the same class is a ``ProcessGroup`` itself (its base is chosen at import).

Synchronous calls run on the calling thread and, from Python, return None, which
``torch.distributed`` accepts: nothing is allocated for a Work that would only be waited on.
Asynchronous calls on CPU tensors (``async_op=True``, and every call DDP's reducer makes) are
queued in call order on the communicator's worker thread and return at once, so DDP overlaps
the backward pass with the buckets' all_reduce as it does on gloo; a synchronous call waits for
the queued ones first. CUDA calls are ordered on the current stream instead.

Under torch.compile the methods run as plain Python, never traced (see `dynamo.outside_dynamo`).
"""
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.autograd import profiler as _torch_profiler

from ..communicator import Communicator
from ..observe import calls, log
from ..observe.calls import traced
from ..world.rendezvous import Rendezvous
from . import reconfigure
from .capabilities import BACKEND_PER_DEVICE
from .dynamo import outside_dynamo
from .point_to_point import TorchPointToPoint
from .reduce_ops import c_op
from .tensors import Contiguous, concatenated, unflatten_into
from .work import CudaWork, FutureWork, completed, finish

NAME = "ringcomm"


class RingcommBackend(c10d.Backend if BACKEND_PER_DEVICE else dist.ProcessGroup):
    """The ringcomm backend of a torch.distributed group: its collectives run on
    ``self.communicator``, a :class:`ringcomm.Communicator` built from the store, unless one of
    these ranks is given. With ``configured=False`` (torch's ``enable_reconfigure=True``) it has
    none until its first :meth:`reconfigure`.
    """

    def __init__(self, store, rank, world_size, timeout, group_name="ringcomm", *,
                 communicator=None, configured=True):
        super().__init__(rank, world_size)
        # Handles for torch's reconfigure API (torch >= 2.14 only has it).
        self._membership = (reconfigure.Membership(store, timeout)
                            if BACKEND_PER_DEVICE and store is not None else None)
        if communicator is None:
            if configured:
                # Keys named after the group: ranks outside a sub-group never build it, so a
                # per-process count of communicators would drift between ranks.
                rendezvous = Rendezvous.from_store(store, rank, world_size, timeout,
                                                   name=group_name)
                communicator = Communicator(rendezvous)
            else:
                communicator = reconfigure.Unconfigured()
        self._group_name = self._group_desc = ""
        self._adopt(communicator, rank, world_size)

    def _adopt(self, communicator, rank, world_size):
        """Runs from here on on `communicator`, as `rank` of `world_size`."""
        self.communicator = communicator
        self._rank, self._world_size = rank, world_size
        self._p2p = TorchPointToPoint(communicator)

    @property
    def rank_and_size(self):
        """This rank and the world size now (a reconfigure renumbers them)."""
        return self._rank, self._world_size

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
        self._p2p.shutdown()
        self.communicator.close()

    # -- coalescing and reconfigure (torch >= 2.14 calls these) --------------------------------

    @property
    def supports_coalescing(self):
        return True

    def start_coalescing(self):
        self._p2p.start_batch()

    def end_coalescing(self):
        return self._p2p.end_batch()

    def get_error(self):
        """torch's error state of the backend (fault-tolerance frameworks ask it before they
        commit a step): COMM_ERROR once a recent call failed, a peer's included."""
        comm = self.communicator
        if isinstance(comm, reconfigure.Unconfigured):
            return c10d.ErrorType.SUCCESS
        failed = any(call["state"] == "failed" for call in comm.flight_record(newest=8))
        return c10d.ErrorType.COMM_ERROR if failed else c10d.ErrorType.SUCCESS

    @property
    def supports_reconfigure(self):
        return self._membership is not None

    def get_reconfigure_handle(self):
        return self._membership.handle

    def reconfigure(self, opts):
        """Rebuilds the communicator for the members whose handles `opts` lists (this process
        among them), after aborting the current one; ranks are renumbered (see
        ringcomm.c10d.reconfigure)."""
        old = self.communicator
        self._p2p.shutdown(wait=False)
        communicator, rank, size = self._membership.reconfigure(opts, old)
        self._adopt(communicator, rank, size)
        return completed([])

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        # The hot path (a contiguous CPU tensor of a supported dtype) goes straight into the
        # C++ ring through the communicator's entry, unless its options ask for more; the rest
        # takes the checked route. Observed as calls.traced would, inline.
        if (log.tracing or _torch_profiler._is_profiler_enabled) and calls.wanted():
            return calls.run("all_reduce", RingcommBackend.allreduce, self,
                             (tensors, opts), {})
        op = c_op(opts, "all_reduce")
        if opts is not None and not opts.asyncOp:  # dist.all_reduce's call: no Work to make
            return self._all_reduce_each(tensors, op)
        return self._collective(opts, tensors, lambda: self._all_reduce_each(tensors, op))

    def _all_reduce_each(self, tensors, op):
        comm = self.communicator
        for t in tensors:
            if t.is_contiguous():
                comm.all_reduce(t, op)  # the ring's entry takes a plain tensor without Python
            else:
                with Contiguous(t) as c:
                    comm.all_reduce(c, op)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        if (log.tracing or _torch_profiler._is_profiler_enabled) and calls.wanted():
            return calls.run("broadcast", RingcommBackend.broadcast, self,
                             (tensors, opts), {})
        root = opts.rootRank if opts is not None else 0
        comm = self.communicator

        def body():
            for t in tensors:
                if t.is_contiguous():
                    comm.broadcast(t, root)  # the ring's entry takes a plain tensor
                else:
                    with Contiguous(t) as c:
                        comm.broadcast(c, root)

        return self._collective(opts, tensors, body)

    @traced("reduce")
    def reduce(self, tensors, opts):
        op = c_op(opts, "reduce")

        def body():
            for t in tensors:
                with Contiguous(t) as c:
                    self.communicator.reduce(c, opts.rootRank, op.name)

        return self._collective(opts, tensors, body)

    @traced("all_gather")
    def all_gather_single(self, output, input, opts=None):
        def body():
            with Contiguous(output) as out:
                self.communicator.all_gather(out, input.contiguous())

        return self._collective(opts, [output], body)

    _allgather_base = all_gather_single

    @traced("all_gather")
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        def body():
            for output, input in zip(outputs, inputs, strict=True):
                with Contiguous(output) as out:
                    self.communicator.all_gather(out, input.contiguous())

        return self._collective(opts, outputs, body)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @traced("all_gather")
    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs, strict=True):
            self._check_list(outputs, input, "all_gather", "output_tensor_list")

        def body():
            for outputs, input in zip(output_lists, inputs, strict=True):
                flat = input.new_empty(self._world_size * input.numel())
                self.communicator.all_gather(flat, input.contiguous())
                unflatten_into(flat, outputs)

        return self._collective(opts, inputs, body, output_lists)

    @traced("all_gather")
    def allgather_coalesced(self, output_lists, inputs, opts=None):
        def body():
            flat_in = concatenated(inputs)
            flat_out = flat_in.new_empty(self._world_size * flat_in.numel())
            self.communicator.all_gather(flat_out, flat_in)
            for rank, outputs in enumerate(output_lists):  # output_lists[r]: rank r's inputs
                unflatten_into(flat_out[rank * flat_in.numel():(rank + 1) * flat_in.numel()],
                                outputs)

        return self._collective(opts, inputs, body, output_lists)

    @traced("reduce_scatter")
    def reduce_scatter_single(self, output, input, opts=None):
        op = c_op(opts, "reduce_scatter")

        def body():
            with Contiguous(output) as out:
                self.communicator.reduce_scatter(out, input.contiguous(), op.name)

        return self._collective(opts, [output], body)

    _reduce_scatter_base = reduce_scatter_single

    @traced("reduce_scatter")
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = c_op(opts, "reduce_scatter")

        def body():
            for output, input in zip(outputs, inputs, strict=True):
                with Contiguous(output) as out:
                    self.communicator.reduce_scatter(out, input.contiguous(), op.name)

        return self._collective(opts, outputs, body)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @traced("reduce_scatter")
    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = c_op(opts, "reduce_scatter")
        for output, inputs in zip(outputs, input_lists, strict=True):
            self._check_list(inputs, output, "reduce_scatter", "input_list")

        def body():
            for output, inputs in zip(outputs, input_lists, strict=True):
                with Contiguous(output) as out:
                    self.communicator.reduce_scatter(out, concatenated(inputs), op.name)

        return self._collective(opts, outputs, body)

    @traced("gather")
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
                unflatten_into(flat, output_lists[0])

        return self._collective(opts, inputs, body, output_lists)

    @traced("scatter")
    def scatter(self, outputs, input_lists, opts):
        (output,) = outputs
        root = opts.rootRank
        if self._rank == root:
            self._check_list(input_lists[0], output, "scatter", "scatter_list")

        def body():
            flat = concatenated(input_lists[0]) if self._rank == root else None
            with Contiguous(output) as out:
                self.communicator.scatter(out, flat, root)

        return self._collective(opts, outputs, body)

    # -- point-to-point and all-to-all ---------------------------------------------------------

    @traced("send")
    def send(self, tensors, dst, tag):
        return self._p2p.send(tensors, dst, tag)

    @traced("recv")
    def recv(self, tensors, src, tag):
        return self._p2p.recv(tensors, src, tag)

    @traced("recv_any")
    def recv_anysource(self, tensors, tag):
        return self._p2p.recv_anysource(tensors, tag)

    @traced("all_to_all")
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._p2p.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                           opts)

    alltoall_base = all_to_all_single

    @traced("all_to_all")
    def alltoall(self, outputs, inputs, opts=None):
        return self._p2p.alltoall(outputs, inputs, opts)

    @traced("barrier")
    def barrier(self, opts=None):
        # A barrier is an allreduce of nothing: every rank's first message needs every rank.
        token = torch.zeros(1, dtype=torch.int8)
        self.communicator.all_reduce(token)
        return completed([token])

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
            name = body.__qualname__.split(".<locals>")[0].rsplit(".", 1)[-1]  # "allreduce"
            return FutureWork(self.communicator.submit(body, result, name),
                              self.communicator.abort)
        body()
        return finish(opts, result)

    def _check_list(self, tensors, like, call, what):
        if len(tensors) != self._world_size:
            raise ValueError(f"ringcomm backend: {call} needs {what} of {self._world_size} "
                             f"tensors (one per rank), got {len(tensors)}")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(f"ringcomm backend: {call}: every tensor of {what} must have "
                                 f"{like.numel()} elements of {like.dtype}, got {t.numel()} of "
                                 f"{t.dtype}")


outside_dynamo(RingcommBackend, TorchPointToPoint, FutureWork, CudaWork)
