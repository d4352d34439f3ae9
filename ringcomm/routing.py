"""How a collective's request reaches a backend: at once on the CPU ring when nothing more is
asked of the call (:meth:`CollectiveRouting.try_run_now`; ``Communicator.run_in_place`` inlines
it), else the checked route, which runs the ``debug``/``check_finite`` exchange and then, by one
decision, runs the request now on the calling thread (on a device backend: on the caller's
stream there) or queues it on the worker thread behind asynchronous work."""
import torch

from . import _C, backends, flight_record, observe, prechecks, waiting, work
from .in_order_queue import on_worker


class CollectiveRouting:
    """Runs requests for :class:`ringcomm.Communicator` (mixed into it), on its backends, lock,
    worker queue and options."""

    def try_run_now(self, request):
        """Runs a :class:`ringcomm.request.CollectiveRequest` on the CPU ring at once, on the
        calling thread, when nothing more is asked of the call: no ``debug`` or
        ``check_finite`` exchange, no asynchronous work still queued, the ring set up and open.
        Returns True when it ran, False, having done nothing, otherwise: the caller then takes
        a collective method (:meth:`all_reduce`, ...), which checks its arguments.

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

    def _route(self, request, buf, data, result, async_op):
        """Runs a checked request whose buffers are on `buf`'s device and whose input on this
        rank is `data` (None: it has none), by one decision: now, on the calling thread (on a
        device backend: ordered on the caller's stream there), unless it is a CPU call that
        ``async_op`` asks to queue on the worker thread or that queued calls are ahead of
        (then it waits for its turn). Returns `result`, or a Work for it. The ``debug`` and
        ``check_finite`` exchanges (:mod:`ringcomm.prechecks`) come first, on this thread."""
        if self.debug or self.check_finite:
            self._queue.wait_for_queued(self.abort)  # queued collectives use the ring first
            prechecks.agree(request, data, self.world_size, self.debug, self.check_finite,
                            self._run_on_cpu)
        if buf.device != "cpu" or not (async_op or self._queue.ahead()):
            self._run(request, buf)
            future = None
        else:
            future = self._queue.submit(result, self._run, request, buf,
                                        name=request.collective.name)
        if not async_op:
            return result if future is None else waiting.wait(future, self.abort)
        if future is None:  # a device backend's, ordered on the caller's stream: no waiting
            return work.completed(result, torch.device(buf.device, buf.device_index))
        return work.Work(future, self.abort)

    def _run(self, request, buf):
        """Runs a request on the backend of its buffers' device (`buf`'s), on the caller's
        stream there."""
        self._call_on_device(buf, lambda comm, stream: comm.run(request.to_c(stream)))

    def _run_on_cpu(self, c_request):
        """Runs a _C.CollectiveRequest on the CPU ring (the prechecks' exchange)."""
        self._call_on_device(_CPU_BUFFER, lambda comm, stream: comm.run(c_request))

    def _call_on_device(self, buf, call):
        """call(the _C.Communicator for the buffer's device, the caller's stream there as an
        integer, 0 on the CPU), under the lock; the backend is set up on first use."""
        with self._lock:
            comm = self._communicator_for(buf.device, buf.device_index)
            call(comm, backends.for_device(buf.device).stream(buf) or 0)

    def _communicator_for(self, device, index):
        """The _C.Communicator of a device's backend, set up on first use (every rank calls
        this together then)."""
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
            observe.set_up(self, device, comm)
            flight_record.watch(self, comm)
        return comm


class _CpuOnly:
    device, device_index = "cpu", -1


_CPU_BUFFER = _CpuOnly()  # routes the checks' small all_gather to the CPU ring
