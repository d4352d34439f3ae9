"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
from . import _C, checks
from .buffers import as_c_dtype
from .observe import log
from .observe.calls import traced
from .observe.flight_record import FlightRecorder
from .options import COLLECTIVES_WITH_ALGORITHM, CommOptions, algorithm_for
from .ops import to_c_op
from .point_to_point import PointToPoint
from .request import (all_gather_request, gather_request, reduce_request, reduce_scatter_request,
                      scatter_request)
from .routing import Router
from .world.rendezvous import Rendezvous

_SUM, _RING = _C.RedOp.sum, _C.Algorithm.ring
_ALL_REDUCE, _BROADCAST = _C.Collective.all_reduce, _C.Collective.broadcast


class Communicator:
    """One rank's handle on ringcomm rings over a torch.distributed group.

    Call it on every rank after ``torch.distributed.init_process_group(...)``; rank, world size
    and the rendezvous store come from the group. Collectives run on the tensors' device: CPU
    tensors and numpy arrays over shared memory between the processes of a host and TCP
    between hosts.

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
            rendezvous = group
            options = options.replace(timeout=options.timeout or group.timeout)
        else:
            rendezvous = Rendezvous(group, options.timeout)
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self.options = options.resolved(self.world_size)
        self.timeout = self.options.timeout
        log.configure(self.options.log)
        self.debug, self.check_finite = self.options.debug, self.options.check_finite
        # What each collective that takes algorithm= runs without one: the option's where it
        # plans that collective, else the ring.
        self._default_algorithms = {
            name: checks.algorithm(algorithm_for(self.options.algorithm, name))
            for name in COLLECTIVES_WITH_ALGORITHM}
        # Owned parts: the router runs every call on the backends (and writes the flight record
        # through the recorder); point-to-point reaches the backends through the router.
        self._recorder = FlightRecorder(rendezvous.label, self.rank, self.world_size,
                                        self.options.trace_dir)
        self._router = Router(rendezvous, self.options, self._recorder)
        self._p2p = PointToPoint(self._router, self.rank, self.world_size, self.timeout,
                                 self.debug)

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

    def all_reduce(self, tensor, op="sum", *, async_op=False, wire_dtype=None, algorithm=None,
                   replay_tag=None):
        """Reduces ``tensor`` over all ranks in place; every rank gets the same result.

        ``wire_dtype`` (torch.bfloat16 or torch.float16, for float32 tensors) sends 16-bit
        messages while each hop still adds in float32 and the result stays float32.
        ``algorithm`` ("ring", "one_shot", "two_shot", "recursive_doubling" or "auto"; default
        ``comm.options.algorithm``) must be the same on every rank; see :mod:`ringcomm.options`.
        ``async_op=True`` returns a :class:`ringcomm.work.Work` (every collective takes it).
        ``replay_tag`` (an int >= 0, the same on every rank) promises that calls with this tag
        come again on the same ``tensor``: on CUDA the second is recorded as a graph and later
        ones replay it (the ``cuda_graphs`` option; DDP's buckets, :mod:`ringcomm.ddp`).

        Example::

            comm.all_reduce(grad, op="avg", wire_dtype=torch.bfloat16)
        """
        if algorithm is None:
            algorithm = self._default_algorithms["all_reduce"]
        else:
            algorithm = checks.algorithm(algorithm)
        wire = None if wire_dtype is None else as_c_dtype(wire_dtype)
        tag = -1 if replay_tag is None else checks.replay_tag(replay_tag)
        result = self._router.run_in_place(_ALL_REDUCE, tensor, to_c_op(op), 0, algorithm, wire,
                                           async_op, tag)
        self._take_entry("all_reduce", _ALL_REDUCE, self._default_algorithms["all_reduce"])
        return result

    @traced("reduce_scatter")
    def reduce_scatter(self, output, input, op="sum", *, async_op=False, algorithm=None):
        """Reduces ``input`` (world_size x output.numel() elements) over ranks; rank r gets block r.

        ``algorithm``: "ring", "one_shot", "recursive_doubling" (between hosts) or "auto", the
        same on every rank (default: the option's where it runs reduce_scatter, else "ring").

        Example::

            comm.reduce_scatter(out, torch.ones(comm.world_size * out.numel()))
        """
        request, out, inp = reduce_scatter_request(
            output, input, to_c_op(op), self._algorithm_for("reduce_scatter", algorithm),
            self.rank, self.world_size)
        return self._router.route(request, out, inp, output, async_op)

    @traced("all_gather")
    def all_gather(self, output, input, *, async_op=False, algorithm=None):
        """Concatenates every rank's ``input`` into ``output`` (world_size x input.numel()).

        ``algorithm``: "ring", "one_shot", "recursive_doubling" (between hosts) or "auto", the
        same on every rank (default: the option's where it runs all_gather, else "ring").

        Example::

            comm.all_gather(torch.empty(comm.world_size * 4), torch.full((4,), comm.rank))
        """
        request, out, inp = all_gather_request(
            output, input, self._algorithm_for("all_gather", algorithm), self.rank,
            self.world_size)
        return self._router.route(request, out, inp, output, async_op)

    def broadcast(self, tensor, src=0, *, async_op=False):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        checks.root(src, "src", self.world_size)
        result = self._router.run_in_place(_BROADCAST, tensor, _SUM, src, _RING, None, async_op)
        self._take_entry("broadcast", _BROADCAST, _RING)
        return result

    def _take_entry(self, name, collective, algorithm):
        """Once the CPU ring is set up, its builtin for the method `name` takes the method's
        place on this communicator: it runs the plain calls itself (no Python frame) and hands
        the rest back to the method (Router.in_place_entry). Not on a subclass that overrides
        the method."""
        method = getattr(Communicator, name)
        if name not in self.__dict__ and getattr(type(self), name) is method:
            entry = self._router.in_place_entry(self, method, collective, algorithm)
            if entry is not None:
                setattr(self, name, entry)

    @traced("reduce")
    def reduce(self, tensor, dst=0, op="sum", *, async_op=False):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        request, buf, data = reduce_request(tensor, dst, to_c_op(op), self.world_size)
        return self._router.route(request, buf, data, tensor, async_op)

    @traced("gather")
    def gather(self, output, input, dst=0, *, async_op=False):
        """Concatenates every rank's ``input`` into ``output`` on rank ``dst`` only.

        ``output`` (world_size x input.numel()) is used on ``dst`` and may be None elsewhere.

        Example::

            out = torch.empty(comm.world_size * 3) if comm.rank == 0 else None
            comm.gather(out, torch.full((3,), comm.rank), dst=0)
        """
        request, inp, data = gather_request(output, input, dst, self.rank, self.world_size)
        return self._router.route(request, inp, data, output, async_op)

    @traced("scatter")
    def scatter(self, output, input, src=0, *, async_op=False):
        """Rank ``src`` splits ``input`` (world_size x output.numel()) and rank r gets block r.

        ``input`` is used on ``src`` and may be None elsewhere.

        Example::

            inp = torch.arange(comm.world_size * 2.0) if comm.rank == 0 else None
            comm.scatter(torch.empty(2), inp, src=0)
        """
        request, out, inp = scatter_request(output, input, src, self.rank, self.world_size)
        return self._router.route(request, out, inp, output, async_op)

    def run_in_place(self, collective, array, op=_SUM, root=0, algorithm=_RING, wire_dtype=None,
                     async_op=False):
        """Runs a collective that works in place (``_C.Collective.all_reduce`` or ``broadcast``)
        on ``array``, its other arguments as raw as the C++ core takes them (``_C`` enums, the
        root's rank); returns ``array``, or a Work with ``async_op``. What :meth:`all_reduce`
        and :meth:`broadcast` run once they have read their keywords (the calls their
        builtins hand back: :meth:`ringcomm.routing.Router.in_place_entry`)."""
        return self._router.run_in_place(collective, array, op, root, algorithm, wire_dtype,
                                         async_op)

    def try_run_now(self, request):
        """Runs a :class:`ringcomm.request.CollectiveRequest` on the CPU ring at once, on the
        calling thread, when nothing more is asked of the call, and returns True; else returns
        False, having done nothing (:meth:`ringcomm.routing.Router.try_run_now` says when)."""
        return self._router.try_run_now(request)

    def default_algorithm(self, collective):
        """The _C.Algorithm ``collective`` (a name) runs when the call names none: the
        ``algorithm`` option where that algorithm plans the collective, else the ring (which
        every collective without ``algorithm=`` runs)."""
        return self._default_algorithms.get(collective, _RING)

    # -- point-to-point ------------------------------------------------------------------------

    @traced("send")
    def send(self, tensor, dst, tag=0):
        """Sends ``tensor`` to rank ``dst``; returns once it is handed over (it may not have been
        received yet). Messages between two ranks are matched in order: the receiving rank's
        :meth:`recv` must name this rank, the same tag and the same element count and dtype, or it
        raises MismatchError.

        On CUDA tensors the call is ordered on the current stream and returns without waiting;
        as with NCCL, a send completes only together with its matching recv (two ranks that both
        send first wait for each other until the timeout: exchange with
        :meth:`batch_isend_irecv`), and NCCL messages carry no header:
        a tag is not checked, and a size that differs from the receive's is undefined on NCCL (it
        may hang until the timeout). With ``debug=True`` every
        CUDA send first sends its tag, count and dtype over the CPU links, and the receive
        raises MismatchError at once when they differ from its own.
        The first CUDA call of a communicator, a send included, sets up its NCCL communicator
        with every rank: all ranks must make a CUDA call.

        Example::

            if comm.rank == 0:
                comm.send(torch.arange(4.0), dst=1, tag=7)
            elif comm.rank == 1:
                comm.recv(buf, src=0, tag=7)
        """
        return self._p2p.send(tensor, dst, tag)

    @traced("recv")
    def recv(self, tensor, src, tag=0):
        """Receives into ``tensor`` the next message rank ``src`` sent this rank (see :meth:`send`)."""
        return self._p2p.recv(tensor, src, tag)

    @traced("recv_any")
    def recv_any(self, tensor, tag=0):
        """Receives into ``tensor`` the next message any rank sent this rank with ``tag``, and
        returns the sender's rank (``torch.distributed.recv`` without ``src``). Ranks are looked
        at in turn, so a steady sender does not starve the others. CPU only: on CUDA, as on
        NCCL, the sender must be named.

        Example::

            src = comm.recv_any(buf, tag=7)
        """
        return self._p2p.recv_any(tensor, tag)

    @traced("batch_isend_irecv")
    def batch_isend_irecv(self, ops):
        """Runs sends and receives, to and from any ranks, as one unit: ``ops`` is a list of
        :class:`ringcomm.P2POp` (or ``(op, tensor, peer[, tag])`` tuples), all on one device.
        No order of them on any rank waits for another: two ranks may both list their send
        first. Messages between two ranks still match in order, as :meth:`send` and
        :meth:`recv` do (batched or not, the k-th message rank a sends rank b meets b's k-th
        receive from a, with the same tag and size). A receive's tensor must not overlap any
        other tensor of the batch.

        On CUDA tensors the batch is one NCCL group, ordered on the current stream, and the
        call returns without waiting (as ``torch.distributed.batch_isend_irecv`` on NCCL): a
        send and its receive must be in one group, or they can wait for each other for ever.
        On CPU tensors it returns once every message has moved.

        Example::

            n = comm.world_size
            comm.batch_isend_irecv([ringcomm.P2POp("send", out, (comm.rank + 1) % n),
                                    ringcomm.P2POp("recv", got, (comm.rank - 1) % n)])
        """
        return self._p2p.batch_isend_irecv(ops)

    @traced("all_to_all")
    def all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None):
        """Rank r sends block p of ``input`` to rank p and receives block r of every rank's input
        into ``output``, blocks in rank order (``torch.distributed.all_to_all_single``). Split sizes
        count rows along dim 0; None splits evenly. What rank p sends rank r must match what rank r
        expects from p, or every rank raises MismatchError.

        Example::

            out = torch.empty(4 * comm.world_size)
            comm.all_to_all(out, torch.arange(4.0 * comm.world_size) + 100 * comm.rank)
        """
        return self._p2p.all_to_all(output, input, output_split_sizes, input_split_sizes)

    # -- traffic -------------------------------------------------------------------------------

    def stats(self):
        """What this rank's transports moved and how long they waited, as they counted it
        (a :class:`ringcomm.CommStats`): bytes and messages sent to and received from each
        peer, collectives run, waits. Summed over the devices this communicator has used.

        Example::

            comm.reset_stats()
            comm.all_reduce(t)
            print(comm.stats().total_sent)    # 2 (N - 1) / N of t's bytes on the ring
        """
        return self._router.stats()

    def reset_stats(self):
        """Starts the counts of :meth:`stats` again from zero."""
        self._router.reset_stats()

    def flight_record(self, newest=None):
        """This rank's last calls, oldest first, per backend: dicts with ``backend``, ``call``
        (their order), ``name``, ``sequence`` (a collective's number: ranks' records line up
        by it), ``state`` (running, completed, failed), ``step`` and ``steps`` (the plan step
        reached), ``started``/``ended`` (Unix seconds) and ``failure``. ``trace_buffer`` calls
        are kept (``newest``: at most that many of each backend's); readable at any time, also
        after a failure. Each also has ``dtype``, ``count`` (elements per rank), ``op``,
        ``algorithm`` and ``peer`` (point-to-point's other rank, a rooted collective's root),
        None where they do not apply. Asynchronous CPU calls still waiting for their turn come
        last, as ``state`` "queued"."""
        return self._router.flight_record(newest)

    def write_flight_record(self, directory=None):
        """Writes :meth:`flight_record` as this rank's file in `directory` (default: the
        ``trace_dir`` option), in the format :mod:`ringcomm.observe.flight_record` gives and
        ``python -m ringcomm.trace`` reads; returns its path."""
        return self._recorder.write(self.flight_record(), "asked", directory)

    # -- life cycle ----------------------------------------------------------------------------

    def submit(self, call, result=None, name="a call"):
        """Queues ``call()`` on this communicator's worker thread, after every asynchronous
        CPU call made before it, and returns at once a ``torch.futures.Future`` that holds
        ``result`` once it has run (or its exception). Collectives that ``call`` makes run at
        once, in its place in the queue; a synchronous call made meanwhile waits for it.
        ``name``: what :meth:`flight_record` calls it while it waits. The torch backend queues
        its asynchronous CPU calls so (DDP's buckets)."""
        return self._router.submit(result, call, name)

    @property
    def closed(self):
        return self._router.closed

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
        self._router.abort(why)

    def close(self):
        """Releases shared memory, device resources and the worker thread; idempotent."""
        for name in ("all_reduce", "broadcast"):  # the builtins (_take_entry) hold the ring
            self.__dict__.pop(name, None)
        self._router.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self._router.backend_count()} backend(s)"
        return f"ringcomm.Communicator(rank={self.rank}, world_size={self.world_size}, {state})"

    # -- helpers -------------------------------------------------------------------------------

    def _algorithm_for(self, collective, name):
        """The _C.Algorithm of a call's algorithm= (None: the communicator's default)."""
        return self._default_algorithms[collective] if name is None else checks.algorithm(name)


def init(group=None, timeout=None, **options):
    """Shorthand for ``ringcomm.Communicator(group, timeout, ...)``.

    Example::

        comm = ringcomm.init(timeout=datetime.timedelta(seconds=60))
    """
    return Communicator(group, timeout, **options)
