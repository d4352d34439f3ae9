"""How a call reaches a backend. A :class:`Router` holds one communicator's backends (one per
device, set up on first use), the lock they run under, the CPU ring, the queue of asynchronous
CPU calls, and whether the communicator was closed or aborted.

A collective's request takes one of two ways: at once on the CPU ring when nothing more is asked
of the call (:meth:`Router.try_run_now`, and the builtins of :meth:`Router.in_place_entry`,
which take the place of ``Communicator.all_reduce`` and ``broadcast``), else the checked route (:meth:`Router.route`), which runs the
``debug``/``check_finite`` exchange and then, by one decision, runs the request now on the
calling thread (on a device backend: on the caller's stream there) or queues it on the worker
thread behind asynchronous work."""

import torch
from torch.autograd import profiler as _torch_profiler

from . import _C, checks, prechecks, waiting, work
from .buffers import TORCH_C_DTYPES
from .in_order_queue import InOrderQueue, on_worker
from .observe import calls, log
from .observe.flight_record import queued
from .observe.stats import CommStats, from_traffic
from .request import CollectiveRequest
from .transport import backends
from .transport.cpu import attach_peer_links

_SUM, _RING = _C.RedOp.sum, _C.Algorithm.ring
_ALL_REDUCE, _BROADCAST = _C.Collective.all_reduce, _C.Collective.broadcast


class Router:
    """Runs one communicator's calls on its backends. `rendezvous`: the communicator's;
    `options`: its resolved CommOptions; `recorder`: its observe.flight_record.FlightRecorder,
    which writes the flight record when a call fails, on abort and on close."""

    def __init__(self, rendezvous, options, recorder):
        self.rank, self.world_size = rendezvous.rank, rendezvous.world_size
        self.debug, self.check_finite = options.debug, options.check_finite
        self._checked = self.debug or self.check_finite  # calls exchange checks: no fast way
        self._rendezvous, self._options, self._recorder = rendezvous, options, recorder
        self._backends = {}  # (device, index) -> _C.Communicator
        self._cpu = None  # the CPU ring's _C.Communicator once set up, until closed
        self._links = None  # the CPU ring's point-to-point links, set up on first use
        self._lock = _C.RouterGate()  # a lock; its ring_open mirrors `_cpu` for the entries
        self._queue = InOrderQueue()  # async_op collectives on CPU, in call order
        self._stats_base = {}  # backend -> collectives run before the last reset_stats
        self._closed = False
        self._aborted = None  # why abort() was called, once it was
        if not any(b.available() for b in backends.registered().values() if b.device != "cpu"):
            # Set up eagerly: set-up errors show here, not mid-training.
            self.communicator_for("cpu", -1)

    # -- the fast way --------------------------------------------------------------------------

    def run_in_place(self, collective, array, op=_SUM, root=0, algorithm=_RING, wire_dtype=None,
                     async_op=False, replay_tag=-1):
        """What ``Communicator.run_in_place`` runs (its all_reduce and broadcast call it here
        directly, for every call their builtins hand back: see :meth:`in_place_entry`): a
        collective that works in place, on ``array``, checked and routed as every collective is,
        its request built once; returns ``array``, or a Work with ``async_op``."""
        if (log.tracing or _torch_profiler._is_profiler_enabled) and calls.wanted():
            name = "all_reduce" if collective == _ALL_REDUCE else "broadcast"
            arguments = (collective, array, op, root, algorithm, wire_dtype, async_op,
                         replay_tag)
            return calls.run(name, Router.run_in_place, self, arguments, {})
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
        return self.route(request, buf, data, array, async_op, replay_tag)

    def in_place_entry(self, owner, method, collective, algorithm):
        """The CPU ring's builtin for ``Communicator.all_reduce`` or ``broadcast``
        (``_C.Communicator.in_place_entry``, `collective`): it runs a call on a plain numpy
        array or a contiguous CPU torch.Tensor that asks nothing more (under this router's lock,
        while the ring is open and no queued call is ahead, unless a trace or profiler watches)
        and hands any other call to ``method(owner, *args, **kwargs)`` (`owner`, the
        communicator, held weakly); `algorithm`: what a call without one runs. None while no
        CPU ring is open, or when every call is checked. Takes no lock: an asynchronous call's
        worker may hold it for as long as its collective waits."""
        comm = self._cpu
        if comm is None or self._checked:
            return None
        return comm.in_place_entry(
            collective, algorithm, owner, method, self._lock, self._queue, on_worker,
            ((log, "tracing"), (_torch_profiler, "_is_profiler_enabled")),
            torch.Tensor, TORCH_C_DTYPES)

    def try_run_now(self, request):
        """What ``Communicator.try_run_now`` runs: a :class:`ringcomm.request.CollectiveRequest` on
        the CPU ring at once, on the calling thread, when nothing more is asked of the call: no
        ``debug`` or ``check_finite`` exchange, no asynchronous work still queued, the ring set
        up and open. Returns True when it ran, False, having done nothing, otherwise: the caller
        then takes a collective method (``comm.all_reduce``, ...), which checks its arguments.

        The request's fields are checked by the C++ core only (addresses of CPU memory). This
        is the path of small calls: the fields go to the ring positionally, with no C++ request
        object (about 0.5 us to build) and no keyword matching (about 0.7 us).

        Example::

            C, t = ringcomm._C, torch.ones(2)
            request = CollectiveRequest(C.Collective.all_reduce, t.data_ptr(), 0, 2,
                                        C.DataType.float32, C.RedOp.sum, 0,
                                        comm.default_algorithm("all_reduce"))
            if not comm.try_run_now(request):
                comm.all_reduce(t)  # debug or queued work asked for more: the checked route
        """
        if self.debug or self.check_finite:
            return False
        self._lock.acquire()  # not `with`, which costs twice as much
        try:
            comm = self._cpu
            if comm is None or (self._queue.last is not None and not on_worker()):
                return False
            comm.run(*request, 0)
            return True
        finally:
            self._lock.release()

    # -- the checked way -----------------------------------------------------------------------

    def route(self, request, buf, data, result, async_op, replay_tag=-1):
        """Runs a checked request whose buffers are on `buf`'s device and whose input on this
        rank is `data` (None: it has none), by one decision: now, on the calling thread (on a
        device backend: ordered on the caller's stream there), unless it is a CPU call that
        ``async_op`` asks to queue on the worker thread or that queued calls are ahead of
        (then it waits for its turn). Returns `result`, or a Work for it. The ``debug`` and
        ``check_finite`` exchanges (:mod:`ringcomm.prechecks`) come first, on this thread.
        `replay_tag`: the caller's (``Communicator.all_reduce``), -1 for none."""
        if self.debug or self.check_finite:
            self._queue.wait_for_queued(self.abort)  # queued collectives use the ring first
            prechecks.agree(request, data, self.world_size, self.debug, self.check_finite,
                            self._run_on_cpu)
        if buf.device != "cpu" or not (async_op or self._queue.ahead()):
            self._run(request, buf, replay_tag)
            future = None
        else:
            future = self._queue.submit(result, self._run, request, buf, replay_tag,
                                        name=request.collective.name)
        if not async_op:
            return result if future is None else waiting.wait(future, self.abort)
        if future is None:  # a device backend's, ordered on the caller's stream: no waiting
            return work.completed(result, torch.device(buf.device, buf.device_index))
        return work.Work(future, self.abort)

    def submit(self, result, call, name):
        """Queues `call()` on the worker thread after every call queued before (see
        ``Communicator.submit``); returns a torch Future that holds `result` once it has run."""
        return self._queue.submit(result, call, name=name)

    def _run(self, request, buf, replay_tag=-1):
        """Runs a request on the backend of its buffers' device (`buf`'s), on the caller's
        stream there."""
        self.call_on_device(buf, lambda comm, stream: comm.run(request.to_c(stream, replay_tag)))

    def _run_on_cpu(self, c_request):
        """Runs a _C.CollectiveRequest on the CPU ring (the prechecks' exchange)."""
        self.call_on_device(_CPU_BUFFER, lambda comm, stream: comm.run(c_request))

    # -- backends ------------------------------------------------------------------------------

    def call_on_device(self, buf, call):
        """call(the _C.Communicator for the buffer's device, the caller's stream there as an
        integer, 0 on the CPU), under the lock; the backend is set up on first use."""
        backend = backends.for_device(buf.device)
        with self._lock:
            comm = self._backend_communicator(backend, buf.device_index)
            call(comm, backend.stream(buf) or 0)

    def _set_cpu_ring(self, comm):
        """The fast way's ring (see try_run_now), None once closed, and the gate's flag that
        says so to the builtins (Router.in_place_entry), written together."""
        self._cpu = comm
        self._lock.ring_open = comm is not None

    def communicator_for(self, device, index):
        """The _C.Communicator of a device's backend, set up on first use (every rank calls
        this together then)."""
        return self._backend_communicator(backends.for_device(device), index)

    def _backend_communicator(self, backend, index):
        """communicator_for, with the device's Backend already looked up."""
        if self._closed:
            raise _C.RingcommError("this ringcomm communicator is closed")
        if self._aborted is not None:
            raise _C.PeerError(f"this ringcomm communicator was aborted and cannot be used "
                               f"again ({self._aborted}); create a new one")
        device = backend.device
        key = (device, index)
        comm = self._backends.get(key)
        if comm is None:
            ordinal = sum(1 for kind, _ in self._backends if kind == device)
            comm = backend.create(self._rendezvous, index, self._options, ordinal)
            if device == "cpu":
                self._set_cpu_ring(comm)
            self._backends[key] = comm
            log.set_up(self.rank, self.world_size, self._options, device, comm)
            self._recorder.watch(comm, self.flight_record)
        return comm

    def peer_links(self):
        """The CPU ring's communicator, with its point-to-point links
        (ringcomm.transport.links.Links), set up on first use."""
        with self._lock:
            comm = self.communicator_for("cpu", -1)
            if self._links is None:
                self._links = attach_peer_links(comm, self._rendezvous, self._options)
            return comm, self._links

    # -- what the backends counted and recorded ------------------------------------------------

    def stats(self):
        """The CommStats of every backend, summed (``Communicator.stats``)."""
        self._queue.wait_for_queued(self.abort)
        total = CommStats()
        with self._lock:
            for key, comm in self._backends.items():
                total = total + from_traffic(comm.traffic(), self._stats_base.get(key, 0))
        return total

    def reset_stats(self):
        self._queue.wait_for_queued(self.abort)
        with self._lock:
            for key, comm in self._backends.items():
                comm.reset_traffic()
                self._stats_base[key] = comm.traffic()["collectives"]

    def flight_record(self, newest=None):
        """Every backend's last calls (at most `newest` each), then the queued ones
        (``Communicator.flight_record``)."""
        return [dict(entry, backend=f"{device}" + (f":{index}" if index >= 0 else ""))
                for (device, index), comm in list(self._backends.items())
                for entry in comm.flight_record(newest)] + queued(self._queue)

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def backend_count(self):
        return len(self._backends)

    def abort(self, why):
        """Fails every backend's calls now, without waiting (``Communicator.abort``)."""
        if self._aborted is None:
            self._aborted = why
            self._recorder.write_or_warn(self.flight_record(), "aborted")
        # Without the lock: the thread running a collective holds it until the collective ends.
        for comm in list(self._backends.values()):
            comm.abort(why)

    def close(self):
        """Runs what is queued, then releases every backend; idempotent."""
        self._queue.close()  # finishes queued async work first
        if not self._closed:
            self._recorder.write_or_warn(self.flight_record(), "closed")
        with self._lock:
            self._closed = True
            self._set_cpu_ring(None)
            if self._links is not None:  # before the ring goes: see transport/shm.py's links
                cpu = self._backends.get(("cpu", -1))
                self._links.close(failed=cpu is None or bool(cpu.failure))
            for comm in self._backends.values():
                comm.close()
            self._backends.clear()
            self._links = None  # point-to-point links (unmapped with the last reference)


class _CpuOnly:
    device, device_index = "cpu", -1


_CPU_BUFFER = _CpuOnly()  # routes the checks' small all_gather to the CPU ring
