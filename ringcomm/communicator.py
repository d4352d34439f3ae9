"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import _C, backends, checks, waiting, work
from .buffers import as_buffer, as_c_dtype, cpu_array
from .options import COLLECTIVES_WITH_ALGORITHM, CommOptions, algorithm_for
from .ops import to_c_op
from .point_to_point import PointToPoint
from .rendezvous import Rendezvous
from .stats import CommStats, from_traffic

_Collective = _C.Collective
_SUM, _RING = _C.RedOp.sum, _C.Algorithm.ring
_ALL_REDUCE, _BROADCAST = _Collective.all_reduce, _Collective.broadcast
# Set on the worker thread while it runs a queued call: calls made from there run at once
# (they are already in order) instead of queueing behind themselves.
_on_worker = threading.local()


class Communicator(PointToPoint):
    """One rank's handle on ringcomm rings over a torch.distributed group.

    Call it on every rank after ``torch.distributed.init_process_group(...)``; rank, world size
    and the rendezvous store come from the group. Collectives run on the tensors' device: CPU
    tensors and numpy arrays over shared memory between the local processes.

    Args:
        group: a torch.distributed process group (default: the default group).
        timeout: a ``datetime.timedelta`` or seconds: the longest any wait may take
            (default: ``torch.distributed.default_pg_timeout``).
        options: a :class:`ringcomm.CommOptions`; keywords (``slice_bytes``, ``slot_count``,
            ``debug``, ...) override its fields. Unset fields come from ``RINGCOMM_*``
            environment variables, else defaults; ``comm.options`` holds what was resolved.
            Among them:
        slice_bytes: pipelining granularity (default: the transport's message size).
        debug: before every collective, compare what each rank is about to run (kind, count,
            dtype, op, root) with one small CPU all_gather and raise MismatchError on every
            rank if they differ. The CPU ring checks this on every message anyway; this mode is
            for CUDA, where NCCL carries no header. Costs one small collective per call
            (~10-100 us). Default: ``RINGCOMM_DEBUG`` is ``1`` or ``DETAIL``.
        check_finite: before every collective, look for NaN/Inf in each rank's input and, if
            any rank has one, raise FloatingPointError on every rank naming the rank and the
            first bad index. Default: ``RINGCOMM_CHECK_FINITE=1``.

    Example::

        dist.init_process_group("gloo")
        comm = ringcomm.Communicator()
        t = torch.ones(1000) * comm.rank
        comm.all_reduce(t)            # every rank: sum of all ranks' values
        comm.close()
    """

    def __init__(self, group=None, timeout=None, *, options=None, **fields):
        options = (options or CommOptions()).replace(timeout=timeout, **fields)
        if isinstance(group, Rendezvous):  # from_store and the torch backend: no process group
            self._rendezvous = group
            options = options.replace(timeout=options.timeout or group.timeout)
        else:
            self._rendezvous = Rendezvous(group, options.timeout)
        self.rank = self._rendezvous.rank
        self.world_size = self._rendezvous.world_size
        self.options = options.resolved(self.world_size)
        self.timeout = self.options.timeout
        self.debug, self.check_finite = self.options.debug, self.options.check_finite
        self._backends = {}
        self._cpu = None  # the CPU ring's _C.Communicator once set up, until closed
        self._lock = threading.Lock()
        self._worker = None  # runs async_op collectives on CPU, in order
        self._links = None  # point-to-point links, set up on first use
        # What each collective that takes algorithm= runs without one: the option's where it
        # plans that collective, else the ring.
        self._default_algorithms = {
            name: checks.algorithm(algorithm_for(self.options.algorithm, name))
            for name in COLLECTIVES_WITH_ALGORITHM}
        self._last = None
        self._stats_base = {}  # backend -> collectives run before the last reset_stats
        self._closed = False
        self._aborted = None  # why abort() was called, once it was
        if not any(b.available() for b in backends.registered().values() if b.device != "cpu"):
            self._backend("cpu", -1)  # set up eagerly: set-up errors show here, not mid-training

    @classmethod
    def from_store(cls, store, rank, world_size, timeout=None, **options):
        """A communicator built from a ``torch.distributed.Store`` instead of a process group:
        no ``init_process_group`` needed (a torch backend's creator runs before it exists).
        Every rank calls it with the same store; keyword options as for the constructor.

        Example::

            store = dist.TCPStore("127.0.0.1", 29500, world_size, rank == 0)
            comm = ringcomm.Communicator.from_store(store, rank, world_size, timeout=60)
        """
        return cls(Rendezvous.from_store(store, rank, world_size, timeout), **options)

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, tensor, op="sum", *, async_op=False, wire_dtype=None, algorithm=None):
        """Reduces ``tensor`` over all ranks in place; every rank gets the same result.

        ``wire_dtype`` (torch.bfloat16 or torch.float16, for float32 tensors) sends 16-bit
        messages while each hop still adds in float32 and the result stays float32.
        ``algorithm`` ("ring", "one_shot", "two_shot" or "auto"; default
        ``comm.options.algorithm``) must be the same on every rank; see :mod:`ringcomm.options`.
        ``async_op=True`` returns a :class:`ringcomm.work.Work` (every collective takes it).

        Example::

            comm.all_reduce(grad, op="avg", wire_dtype=torch.bfloat16)
        """
        c_op = to_c_op(op)
        if algorithm is None:
            algorithm = self._default_algorithms["all_reduce"]
        else:
            algorithm = checks.algorithm(algorithm)
        wire = None if wire_dtype is None else as_c_dtype(wire_dtype)
        fast = None if async_op else cpu_array(tensor)
        if fast is not None:
            address, count, dtype = fast
            if self.try_run_now(_ALL_REDUCE, address, 0, count, dtype, c_op, 0, algorithm, wire):
                return tensor
        buf = checks.writable(tensor, "tensor")
        if wire == buf.c_dtype:
            wire = None
        request = (_ALL_REDUCE, buf.address, 0, buf.numel, buf.c_dtype, c_op, 0, algorithm, wire)
        self._precheck(request, buf)
        return self._run_in_order(buf, request, tensor, async_op)

    def reduce_scatter(self, output, input, op="sum", *, async_op=False, algorithm=None):
        """Reduces ``input`` (world_size x output.numel() elements) over ranks; rank r gets block r.

        ``algorithm``: "ring", "one_shot" or "auto", the same on every rank (default: the
        option's where it runs reduce_scatter, else "ring").

        Example::

            comm.reduce_scatter(out, torch.ones(comm.world_size * out.numel()))
        """
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        checks.sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
        checks.aliasing(out, inp, inp.element_address(self.rank * out.numel))
        c_algorithm = self._algorithm_for("reduce_scatter", algorithm)
        request = (_Collective.reduce_scatter, out.address, inp.address, out.numel, out.c_dtype,
                   to_c_op(op), 0, c_algorithm, None)
        self._precheck(request, inp)
        return self._run_in_order(out, request, output, async_op)

    def all_gather(self, output, input, *, async_op=False, algorithm=None):
        """Concatenates every rank's ``input`` into ``output`` (world_size x input.numel()).

        ``algorithm``: "ring", "one_shot" or "auto", the same on every rank (default: the
        option's where it runs all_gather, else "ring").

        Example::

            comm.all_gather(torch.empty(comm.world_size * 4), torch.full((4,), comm.rank))
        """
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        checks.sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
        checks.aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
        request = (_Collective.all_gather, out.address, inp.address, inp.numel, out.c_dtype, _SUM, 0,
                   self._algorithm_for("all_gather", algorithm), None)
        self._precheck(request, inp)
        return self._run_in_order(out, request, output, async_op)

    def broadcast(self, tensor, src=0, *, async_op=False):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        checks.root(src, "src", self.world_size)
        fast = None if async_op else cpu_array(tensor)
        if fast is not None:
            address, count, dtype = fast
            if self.try_run_now(_BROADCAST, address, 0, count, dtype, _SUM, src, _RING, None):
                return tensor
        buf = checks.writable(tensor, "tensor")
        request = (_BROADCAST, buf.address, 0, buf.numel, buf.c_dtype, _SUM, src, _RING, None)
        self._precheck(request, buf if self.rank == src else None)
        return self._run_in_order(buf, request, tensor, async_op)

    def reduce(self, tensor, dst=0, op="sum", *, async_op=False):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        buf = checks.writable(tensor, "tensor")
        checks.root(dst, "dst", self.world_size)
        request = (_Collective.reduce, buf.address, 0, buf.numel, buf.c_dtype, to_c_op(op), dst, _RING, None)
        self._precheck(request, buf)
        return self._run_in_order(buf, request, tensor, async_op)

    def gather(self, output, input, dst=0, *, async_op=False):
        """Concatenates every rank's ``input`` into ``output`` on rank ``dst`` only.

        ``output`` (world_size x input.numel()) is used on ``dst`` and may be None elsewhere.

        Example::

            out = torch.empty(comm.world_size * 3) if comm.rank == 0 else None
            comm.gather(out, torch.full((3,), comm.rank), dst=0)
        """
        inp = as_buffer(input, "input")
        checks.root(dst, "dst", self.world_size)
        address = 0
        if self.rank == dst:
            if output is None:
                raise ValueError(f"gather needs an output tensor on dst rank {dst}")
            out = checks.writable(output, "output")
            checks.same_kind(out, inp)
            checks.sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
            checks.aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
            address = out.address
        request = (_Collective.gather, address, inp.address, inp.numel, inp.c_dtype, _SUM, dst, _RING, None)
        self._precheck(request, inp)
        return self._run_in_order(inp, request, output, async_op)

    def scatter(self, output, input, src=0, *, async_op=False):
        """Rank ``src`` splits ``input`` (world_size x output.numel()) and rank r gets block r.

        ``input`` is used on ``src`` and may be None elsewhere.

        Example::

            inp = torch.arange(comm.world_size * 2.0) if comm.rank == 0 else None
            comm.scatter(torch.empty(2), inp, src=0)
        """
        out = checks.writable(output, "output")
        checks.root(src, "src", self.world_size)
        address = 0
        if self.rank == src:
            if input is None:
                raise ValueError(f"scatter needs an input tensor on src rank {src}")
            inp = as_buffer(input, "input")
            checks.same_kind(out, inp)
            checks.sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
            checks.aliasing(out, inp, inp.element_address(self.rank * out.numel))
            address = inp.address
        request = (_Collective.scatter, out.address, address, out.numel, out.c_dtype, _SUM, src, _RING, None)
        self._precheck(request, inp if self.rank == src else None)
        return self._run_in_order(out, request, output, async_op)

    # -- the hot path --------------------------------------------------------------------------

    def try_run_now(self, collective, output, input, count, dtype, op=_SUM, root=0,
                    algorithm=_RING, wire_dtype=None):
        """Runs one collective on the CPU ring at once, on the calling thread, when nothing more
        is asked of the call: no ``debug`` or ``check_finite`` exchange, no asynchronous work
        still queued, the ring set up and open. Returns True when it ran, False, having done
        nothing, otherwise: the caller then takes a collective method (:meth:`all_reduce`, ...),
        which checks its arguments.

        The arguments are a ``_C.CollectiveRequest``'s fields, in its order and as raw as it
        takes them (addresses of CPU memory, element counts, ``_C`` enums; ``input`` 0 for the
        collectives that run in place), checked by the C++ core only. This is the path of small
        calls: no request object (about 0.5 us to build), no keyword matching (about 0.7 us).
        The torch backend calls it; the collective methods go through it too.

        Example::

            C, t = ringcomm._C, torch.ones(2)
            if not comm.try_run_now(C.Collective.all_reduce, t.data_ptr(), 0, 2, C.DataType.float32,
                                    C.RedOp.sum, 0, comm.default_algorithm("all_reduce")):
                comm.all_reduce(t)  # debug or queued work asked for more: the checked route
        """
        if self.debug or self.check_finite:
            return False
        self._lock.acquire()  # not `with`, which costs twice as much
        try:
            comm = self._cpu
            if comm is None or (self._last is not None and
                                not getattr(_on_worker, "active", False)):
                return False
            comm.run(collective, output, input, count, dtype, op, root, algorithm, wire_dtype, 0)
            return True
        finally:
            self._lock.release()

    def default_algorithm(self, collective):
        """The _C.Algorithm ``collective`` (a name) runs when the call names none: the
        ``algorithm`` option where that algorithm plans the collective, else the ring (which
        every collective without ``algorithm=`` runs)."""
        return self._default_algorithms.get(collective, _RING)

    # -- traffic -------------------------------------------------------------------------------

    def stats(self):
        """What this rank's transports moved and how long they waited, as they counted it
        (a :class:`ringcomm.stats.CommStats`): bytes and messages sent to and received from each
        peer, collectives run, waits. Summed over the devices this communicator has used.

        Example::

            comm.reset_stats()
            comm.all_reduce(t)
            print(comm.stats().total_sent)    # 2 (N - 1) / N of t's bytes on the ring
        """
        self._drain()
        total = CommStats()
        with self._lock:
            for key, comm in self._backends.items():
                total = total + from_traffic(comm.traffic(), self._stats_base.get(key, 0))
        return total

    def reset_stats(self):
        """Starts the counts of :meth:`stats` again from zero."""
        self._drain()
        with self._lock:
            for key, comm in self._backends.items():
                comm.reset_traffic()
                self._stats_base[key] = comm.traffic()["collectives"]

    def _drain(self):
        """Waits for the collectives queued on the worker."""
        last = self._last
        if last is not None:
            waiting.wait(last, self.abort)

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def abort(self, why="aborted by the caller"):
        """Fails this rank's collectives now, the one running on another thread included, and
        every peer's (a :class:`ringcomm.PeerError` naming this rank and `why`); the
        communicator then refuses further use. Unlike :meth:`close` it never waits, so any
        thread may call it while a collective runs; :meth:`close` still frees the resources.
        A Work's ``wait()`` interrupted by Ctrl-C calls it.

        Example::

            comm.abort("a peer reported bad data")  # every rank's pending call raises
            comm.close()
        """
        if self._aborted is None:
            self._aborted = why
        # Without the lock: the thread running a collective holds it until the collective ends.
        for comm in list(self._backends.values()):
            comm.abort(why)

    def close(self):
        """Releases shared memory, device resources and the worker thread; idempotent."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # finishes queued async work first
            self._worker = None
        with self._lock:
            self._closed, self._cpu = True, None
            if self._links is not None:  # before the ring goes: see PeerLinks
                cpu = self._backends.get(("cpu", -1))
                self._links.close(failed=cpu is None or bool(cpu.failure))
            for comm in self._backends.values():
                comm.close()
            self._backends.clear()
            self._links = None  # point-to-point links (unmapped with the last reference)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self._backends)} backend(s)"
        return f"ringcomm.Communicator(rank={self.rank}, world_size={self.world_size}, {state})"

    # -- helpers -------------------------------------------------------------------------------

    def _backend(self, device, index):
        if self._closed:
            raise _C.RingcommError("this ringcomm communicator is closed")
        if self._aborted is not None:
            raise _C.PeerError(f"this ringcomm communicator was aborted and cannot be used "
                               f"again ({self._aborted}); create a new one")
        key = (device, index)
        comm = self._backends.get(key)
        if comm is None:
            ordinal = sum(1 for kind, _ in self._backends if kind == device)
            comm = backends.for_device(device).create(self._rendezvous, index, self.options,
                                                      ordinal)
            if device == "cpu":
                self._cpu = comm  # the hot path's ring (see try_run_now)
            self._backends[key] = comm
        return comm

    def _algorithm_for(self, collective, name):
        """The _C.Algorithm of a call's algorithm= (None: the communicator's default)."""
        return self._default_algorithms[collective] if name is None else checks.algorithm(name)

    def _precheck(self, request, data):
        """Debug and NaN/Inf checks of a request (its fields, as for try_run_now) whose input
        is `data` on this rank (None: it has none): one small all_gather over the CPU ring, so
        that every rank reaches the same verdict and raises together instead of leaving its
        peers waiting. Ranks compare the header the C++ messages carry (_C.collective_header),
        with the algorithm asked for (ranks must ask for the same)."""
        if not (self.debug or self.check_finite):
            return
        if self._last is not None and not getattr(_on_worker, "active", False):
            waiting.wait(self._last, self.abort)  # queued async collectives use the ring first
        first_bad = checks.first_non_finite(data) if self.check_finite and data is not None else -1
        header = _C.collective_header(_C.CollectiveRequest(*request))
        mine = torch.tensor(header + [first_bad], dtype=torch.int64)
        everyone = torch.empty(self.world_size * mine.numel(), dtype=torch.int64)
        exchange = _C.CollectiveRequest(_Collective.all_gather, everyone.data_ptr(), mine.data_ptr(),
                                        mine.numel(), _C.DataType.int64)
        self._on_backend(_CPU_BUFFER, lambda comm, stream: comm.run(exchange))
        rows = everyone.view(self.world_size, -1).tolist()
        name = request[0].name
        if self.debug and any(row[:-1] != header for row in rows):
            described = "; ".join(f"rank {r}: {_C.describe_collective(row[:-1])}"
                                  for r, row in enumerate(rows))
            raise _C.MismatchError(f"{name}: ranks called different collectives ({described})")
        bad = [(r, row[-1]) for r, row in enumerate(rows) if row[-1] >= 0]
        if bad:
            where = ", ".join(f"rank {r} at index {i}" for r, i in bad)
            raise FloatingPointError(f"{name}: NaN or Inf in the input of {where}")

    def _on_backend(self, buf, call):
        """call(the _C.Communicator for the buffer's device, the caller's stream there as an
        integer, 0 on the CPU), under the lock; the backend is set up on first use."""
        with self._lock:
            comm = self._backend(buf.device, buf.device_index)
            call(comm, backends.for_device(buf.device).stream(buf) or 0)

    def _run_request(self, buf, request):
        """Runs a request (its fields) on the backend of its buffers' device, on the caller's
        stream there."""
        request = _C.CollectiveRequest(*request)

        def run(comm, stream):
            request.stream = stream
            comm.run(request)

        self._on_backend(buf, run)

    def _run_in_order(self, buf, request, result, async_op):
        """Runs a request (its fields) now, or (async_op on CPU) queued on the worker thread,
        in call order; returns `result`, or a Work for it."""
        if buf.device != "cpu":  # device backends order it on the caller's stream: no waiting
            self._run_request(buf, request)
            if not async_op:
                return result
            return work.completed(result, torch.device(buf.device, buf.device_index))
        if not async_op and self.try_run_now(*request):
            return result
        if not async_op and (self._last is None or self._last.done() or
                             getattr(_on_worker, "active", False)):
            if self._last is not None and self._last.done():
                self._last = None  # nothing queued: try_run_now may run the next calls directly
            self._run_request(buf, request)
            return result
        future = self._submit(lambda: self._run_request(buf, request), result)
        if not async_op:  # queued behind async work: keep the order, then wait
            return waiting.wait(future, self.abort)
        return work.Work(future, self.abort)

    def _submit(self, call, result):
        """Queues `call` on the worker thread, after every call queued before; returns a
        torch Future that holds `result` once `call` has run (or its exception). Collectives
        that `call` makes run at once, in its place in the queue."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="ringcomm")
        future = torch.futures.Future()

        def task():
            _on_worker.active = True
            try:
                call()
                future.set_result(result)
            except Exception as error:  # delivered to whoever waits on the future
                future.set_exception(error)
            finally:
                _on_worker.active = False

        self._last = self._worker.submit(task)
        return future


class _CpuOnly:
    device, device_index = "cpu", -1


_CPU_BUFFER = _CpuOnly()  # routes the checks' small all_gather to the CPU ring
