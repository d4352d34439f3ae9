"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
import threading

import numpy as np
import torch
from torch.autograd import profiler as _torch_profiler

from . import _C, backends, checks, flight_record, observe
from .buffers import NUMPY_C_DTYPES, TORCH_C_DTYPES, as_buffer, as_c_dtype
from .in_order_queue import InOrderQueue, on_worker
from .options import COLLECTIVES_WITH_ALGORITHM, CommOptions, algorithm_for
from .ops import to_c_op
from .point_to_point import PointToPoint
from .rendezvous import Rendezvous
from .request import CollectiveRequest
from .routing import CollectiveRouting
from .stats import CommStats, from_traffic

_Collective = _C.Collective
_SUM, _RING = _C.RedOp.sum, _C.Algorithm.ring
_ALL_REDUCE, _BROADCAST = _Collective.all_reduce, _Collective.broadcast


class Communicator(PointToPoint, CollectiveRouting):
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
        observe.configure(self.options.log)
        self.debug, self.check_finite = self.options.debug, self.options.check_finite
        self._backends = {}
        self._cpu = None  # the CPU ring's _C.Communicator once set up, until closed
        self._lock = threading.Lock()
        self._queue = InOrderQueue()  # async_op collectives on CPU, in call order
        self._links = None  # point-to-point links, set up on first use
        # What each collective that takes algorithm= runs without one: the option's where it
        # plans that collective, else the ring.
        self._default_algorithms = {
            name: checks.algorithm(algorithm_for(self.options.algorithm, name))
            for name in COLLECTIVES_WITH_ALGORITHM}
        self._stats_base = {}  # backend -> collectives run before the last reset_stats
        self._closed = False
        self._aborted = None  # why abort() was called, once it was
        if not any(b.available() for b in backends.registered().values() if b.device != "cpu"):
            # Set up eagerly: set-up errors show here, not mid-training.
            self._communicator_for("cpu", -1)

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
        if algorithm is None:
            algorithm = self._default_algorithms["all_reduce"]
        else:
            algorithm = checks.algorithm(algorithm)
        wire = None if wire_dtype is None else as_c_dtype(wire_dtype)
        return self.run_in_place(_ALL_REDUCE, tensor, to_c_op(op), 0, algorithm, wire, async_op)

    @observe.traced("reduce_scatter")
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
        request = CollectiveRequest(_Collective.reduce_scatter, out.address, inp.address,
                                    out.numel, out.c_dtype, to_c_op(op), 0,
                                    self._algorithm_for("reduce_scatter", algorithm))
        return self._route(request, out, inp, output, async_op)

    @observe.traced("all_gather")
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
        request = CollectiveRequest(_Collective.all_gather, out.address, inp.address, inp.numel,
                                    out.c_dtype, _SUM, 0,
                                    self._algorithm_for("all_gather", algorithm))
        return self._route(request, out, inp, output, async_op)

    def broadcast(self, tensor, src=0, *, async_op=False):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        checks.root(src, "src", self.world_size)
        return self.run_in_place(_BROADCAST, tensor, _SUM, src, _RING, None, async_op)

    @observe.traced("reduce")
    def reduce(self, tensor, dst=0, op="sum", *, async_op=False):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        buf = checks.writable(tensor, "tensor")
        checks.root(dst, "dst", self.world_size)
        request = CollectiveRequest(_Collective.reduce, buf.address, 0, buf.numel, buf.c_dtype,
                                    to_c_op(op), dst)
        return self._route(request, buf, buf, tensor, async_op)

    @observe.traced("gather")
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
        request = CollectiveRequest(_Collective.gather, address, inp.address, inp.numel,
                                    inp.c_dtype, _SUM, dst)
        return self._route(request, inp, inp, output, async_op)

    @observe.traced("scatter")
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
        request = CollectiveRequest(_Collective.scatter, out.address, address, out.numel,
                                    out.c_dtype, _SUM, src)
        return self._route(request, out, inp if self.rank == src else None, output, async_op)

    def run_in_place(self, collective, array, op=_SUM, root=0, algorithm=_RING, wire_dtype=None,
                     async_op=False):
        """Runs a collective that works in place (``_C.Collective.all_reduce`` or ``broadcast``)
        on ``array``, its other arguments as raw as the C++ core takes them (``_C`` enums, the
        root's rank); returns ``array``, or a Work with ``async_op``. What :meth:`all_reduce`
        and :meth:`broadcast` run once they have read their keywords, and what the torch
        backend calls.

        The hot path is :meth:`try_run_now`'s, inlined: a contiguous, writable CPU torch tensor
        or numpy array of a supported dtype, when nothing more is asked of the call, goes to the
        ring at once, its address, count and dtype read straight into the ring's positional
        arguments (a request object, a Buffer or one more call would each cost a tenth of such
        a call or more). Anything else, or what the hot path declines, is checked and routed
        as every collective is, its request built once."""
        if (observe.tracing or _torch_profiler._is_profiler_enabled) and observe.wanted():
            name = "all_reduce" if collective == _ALL_REDUCE else "broadcast"
            arguments = (collective, array, op, root, algorithm, wire_dtype, async_op)
            return observe.run(name, Communicator.run_in_place, self, arguments, {})
        if not (async_op or self.debug or self.check_finite):
            address = 0  # stays 0 unless `array` is plain CPU memory the ring can take as it is
            if isinstance(array, torch.Tensor):
                dtype = TORCH_C_DTYPES.get(array.dtype)
                if dtype is not None and array.is_cpu and array.is_contiguous():
                    address, count = array.data_ptr(), array.numel()
            elif isinstance(array, np.ndarray):
                dtype, flags = NUMPY_C_DTYPES.get(array.dtype), array.flags
                if dtype is not None and flags.c_contiguous and flags.writeable:
                    address, count = array.ctypes.data, array.size
            if address:
                self._lock.acquire()  # not `with`, which costs twice as much
                try:
                    comm = self._cpu
                    if comm is not None and (self._queue.last is None or on_worker()):
                        comm.run(collective, address, 0, count, dtype, op, root, algorithm,
                                 wire_dtype, 0)
                        return array
                finally:
                    self._lock.release()
        buf = checks.writable(array, "tensor")
        if wire_dtype == buf.c_dtype:
            wire_dtype = None
        request = CollectiveRequest(collective, buf.address, 0, buf.numel, buf.c_dtype, op,
                                    root, algorithm, wire_dtype)
        if collective == _BROADCAST:
            checks.root(root, "src", self.world_size)
            data = buf if self.rank == root else None
        else:
            data = buf
        return self._route(request, buf, data, array, async_op)

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
        self._queue.wait_for_queued(self.abort)
        total = CommStats()
        with self._lock:
            for key, comm in self._backends.items():
                total = total + from_traffic(comm.traffic(), self._stats_base.get(key, 0))
        return total

    def flight_record(self):
        """This rank's last calls, oldest first, per backend: dicts with ``backend``, ``call``
        (their order), ``name``, ``sequence`` (a collective's number: ranks' records line up
        by it), ``state`` (running, completed, failed), ``step`` and ``steps`` (the plan step
        reached), ``started``/``ended`` (Unix seconds) and ``failure``. ``trace_buffer`` calls
        are kept; readable at any time, also after a failure. Each also has ``dtype``,
        ``count`` (elements per rank), ``op``, ``algorithm`` and ``peer`` (point-to-point's
        other rank, a rooted collective's root), None where they do not apply. Asynchronous
        CPU calls still waiting for their turn come last, as ``state`` "queued"."""
        return [dict(entry, backend=f"{device}" + (f":{index}" if index >= 0 else ""))
                for (device, index), comm in list(self._backends.items())
                for entry in comm.flight_record()] + flight_record.queued(self._queue)

    def write_flight_record(self, directory=None):
        """Writes :meth:`flight_record` as this rank's file in `directory` (default: the
        ``trace_dir`` option), in the format :mod:`ringcomm.flight_record` gives and
        ``python -m ringcomm.trace`` reads; returns its path."""
        return flight_record.write(self, "asked", directory)

    def reset_stats(self):
        """Starts the counts of :meth:`stats` again from zero."""
        self._queue.wait_for_queued(self.abort)
        with self._lock:
            for key, comm in self._backends.items():
                comm.reset_traffic()
                self._stats_base[key] = comm.traffic()["collectives"]

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
            flight_record.write_or_warn(self, "aborted")
        # Without the lock: the thread running a collective holds it until the collective ends.
        for comm in list(self._backends.values()):
            comm.abort(why)

    def close(self):
        """Releases shared memory, device resources and the worker thread; idempotent."""
        self._queue.close()  # finishes queued async work first
        if not self._closed:
            flight_record.write_or_warn(self, "closed")
        with self._lock:
            self._closed, self._cpu = True, None
            if self._links is not None:  # before the ring goes: see shm_links
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

    def _algorithm_for(self, collective, name):
        """The _C.Algorithm of a call's algorithm= (None: the communicator's default)."""
        return self._default_algorithms[collective] if name is None else checks.algorithm(name)
