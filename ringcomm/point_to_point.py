"""Point-to-point and all-to-all for Communicator: on CPU over shared-memory peer links set up
on first use, on CUDA over the ring's NCCL communicator."""
import time
from typing import NamedTuple

import torch

from . import _C, backends, checks, observe
from .buffers import as_buffer

_ENVELOPE_TAG = (1 << 30) + 0xE1  # the debug envelopes' tag on the CPU links


class P2POp(NamedTuple):
    """One operation of :meth:`Communicator.batch_isend_irecv`: ``op`` is ``"send"`` (``tensor``
    to rank ``peer``) or ``"recv"`` (into ``tensor`` from rank ``peer``)."""

    op: str
    tensor: object
    peer: int
    tag: int = 0


class PointToPoint:
    """send, recv and all_to_all; mixed into :class:`ringcomm.Communicator`, whose ring, lock,
    rendezvous and options they use."""

    @observe.traced("send")
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
        buf = as_buffer(tensor, "tensor")
        self._peer(dst, "dst")
        if self._on_ring(buf):
            if self.debug:
                self._debug_envelope("send", dst, buf, tag)
            self._call_on_device(buf, lambda comm, stream: comm.send(
                buf.address, buf.numel, buf.c_dtype, dst, int(tag), stream))
            return tensor
        comm, links = self._peer_links()
        links.to(dst)
        comm.send(buf.address, buf.numel, buf.c_dtype, dst, int(tag))
        return tensor

    @observe.traced("recv")
    def recv(self, tensor, src, tag=0):
        """Receives into ``tensor`` the next message rank ``src`` sent this rank (see :meth:`send`)."""
        buf = checks.writable(tensor, "tensor")
        self._peer(src, "src")
        if self._on_ring(buf):
            if self.debug:
                self._debug_envelope("recv", src, buf, tag)
            self._call_on_device(buf, lambda comm, stream: comm.recv(
                buf.address, buf.numel, buf.c_dtype, src, int(tag), stream))
            return tensor
        comm, links = self._peer_links()
        links.from_(src)
        comm.recv(buf.address, buf.numel, buf.c_dtype, src, int(tag))
        return tensor

    @observe.traced("recv_any")
    def recv_any(self, tensor, tag=0):
        """Receives into ``tensor`` the next message any rank sent this rank with ``tag``, and
        returns the sender's rank (``torch.distributed.recv`` without ``src``). Ranks are looked
        at in turn, so a steady sender does not starve the others. CPU only: on CUDA, as on
        NCCL, the sender must be named.

        Example::

            src = comm.recv_any(buf, tag=7)
        """
        buf = checks.writable(tensor, "tensor")
        if self._on_ring(buf):
            raise NotImplementedError("recv from any source is not supported on CUDA tensors "
                                      "(NCCL needs the sending rank): name src")
        if self.world_size == 1:
            raise ValueError("recv from any source: this communicator has no other rank")
        comm, links = self._peer_links()
        deadline = time.monotonic() + self.timeout
        pause, start = 0.0, self._any_source_start
        while True:
            for k in range(self.world_size):
                peer = (start + k) % self.world_size
                if peer != self.rank and links.arrived_tag(peer) == int(tag):
                    self._any_source_start = peer + 1
                    comm.recv(buf.address, buf.numel, buf.c_dtype, peer, int(tag))
                    return peer
            if time.monotonic() > deadline:
                raise _C.CommTimeoutError(
                    f"rank {self.rank} timed out after {self.timeout} s in recv from any source "
                    f"(tag {tag}): no rank sent it a message with that tag")
            time.sleep(pause)  # the first passes only yield; then up to 1 ms between looks
            pause = min(1e-3, pause * 2 or 1e-5)

    _any_source_start = 0  # the rank a receive from any source looks at first

    @observe.traced("batch_isend_irecv")
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
        entries = []  # (is_send, Buffer, peer, tag)
        for i, op in enumerate(ops):
            try:
                op = P2POp(*op)
            except TypeError:
                raise TypeError(f"ops[{i}] must be a ringcomm.P2POp or an (op, tensor, peer[, "
                                f"tag]) tuple, not {type(op).__name__}") from None
            what = f"ops[{i}].tensor"
            if op.op not in ("send", "recv"):
                raise ValueError(f"ops[{i}]: op must be 'send' or 'recv', got {op.op!r}")
            buf = (as_buffer if op.op == "send" else checks.writable)(op.tensor, what)
            self._peer(op.peer, f"ops[{i}].peer")
            if entries and (buf.device, buf.device_index) != (entries[0][1].device,
                                                              entries[0][1].device_index):
                raise ValueError(f"batch_isend_irecv: {what} is on another device than "
                                 "ops[0].tensor; a batch's tensors must share one device")
            entries.append((op.op == "send", buf, op.peer, int(op.tag)))
        if not entries:
            return
        fields = [(send, buf.address, buf.numel, buf.c_dtype, peer, tag)
                  for send, buf, peer, tag in entries]
        first = entries[0][1]
        if self._on_ring(first):  # one NCCL group, ordered on the current stream
            if self.debug:
                self._debug_envelopes(entries)
            self._call_on_device(first, lambda comm, stream: comm.send_recv_batch(fields, stream))
            return
        self._batch_links(entries).send_recv_batch(fields)

    @observe.traced("all_to_all")
    def all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None):
        """Rank r sends block p of ``input`` to rank p and receives block r of every rank's input
        into ``output``, blocks in rank order (``torch.distributed.all_to_all_single``). Split sizes
        count rows along dim 0; None splits evenly. What rank p sends rank r must match what rank r
        expects from p, or every rank raises MismatchError.

        Example::

            out = torch.empty(4 * comm.world_size)
            comm.all_to_all(out, torch.arange(4.0 * comm.world_size) + 100 * comm.rank)
        """
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        if out.overlaps(inp):
            raise ValueError("all_to_all: input and output must not overlap")
        send_counts = _split_counts(inp, input_split_sizes, self.world_size, "input")
        recv_counts = _split_counts(out, output_split_sizes, self.world_size, "output")
        if self._on_ring(out):  # every step one NCCL group, ordered on the current stream
            self._call_on_device(out, lambda comm, stream: comm.all_to_all(
                out.address, inp.address, send_counts, recv_counts, out.c_dtype, stream))
            return output
        comm, links = self._peer_links() if self.world_size > 1 else (self._communicator_for("cpu", -1), None)
        if links is not None:
            for peer in range(self.world_size):
                if peer != self.rank:
                    links.to(peer)
            for peer in range(self.world_size):
                if peer != self.rank:
                    links.from_(peer)
        comm.all_to_all(out.address, inp.address, send_counts, recv_counts, out.c_dtype)
        return output

    def _debug_envelope(self, kind, peer, buf, tag):
        """debug=True where messages carry no header (NCCL): see _debug_envelopes."""
        self._debug_envelopes([(kind == "send", buf, peer, tag)])

    def _debug_envelopes(self, entries):
        """debug=True where messages carry no header (NCCL), for (is_send, Buffer, peer, tag)
        entries: every send first sends its tag, count and dtype over the CPU links, and every
        receive compares them with its own before the payload is posted, raising MismatchError
        naming both (the sender's payload then waits for the timeout). The envelopes move as one
        batch of the same shape, so they wait on each other no more than the payloads do. Costs
        a CPU message per entry, and a host wait."""
        envelopes = [torch.tensor([int(tag), buf.numel, int(buf.c_dtype)], dtype=torch.int64)
                     if send else torch.empty(3, dtype=torch.int64)
                     for send, buf, peer, tag in entries]
        self._batch_links(entries).send_recv_batch(
            [(send, e.data_ptr(), 3, _C.DataType.int64, peer, _ENVELOPE_TAG)
             for (send, _, peer, _), e in zip(entries, envelopes)])
        for (send, buf, peer, tag), theirs in zip(entries, envelopes):
            mine = [int(tag), buf.numel, int(buf.c_dtype)]
            if not send and theirs.tolist() != mine:
                def describe(tag, count, dtype):
                    return f"tag {tag}, {count} x {_C.DataType(dtype).name}"
                raise _C.MismatchError(f"recv from rank {peer}: it sent "
                                       f"{describe(*theirs.tolist())}, rank {self.rank} expected "
                                       f"{describe(*mine)}")

    def _on_ring(self, buf):
        """Whether point-to-point on this buffer's device goes over the ring's own communicator
        (NCCL) rather than the CPU's point-to-point links."""
        return backends.for_device(buf.device).p2p_on_ring

    def _peer_links(self):
        """The CPU ring's communicator, with its point-to-point links (ringcomm.links.Links):
        the ones it made at set-up (across hosts), else made now."""
        with self._lock:
            comm = self._communicator_for("cpu", -1)
            links = self._links
            if links is None:
                from .links import Links

                links = getattr(comm, "peer_links", None) or Links(
                    self._rendezvous, self.options, None, "p2p")
                comm.set_peer_links(links.transport)
                self._links = links
            return comm, links

    def _batch_links(self, entries):
        """The CPU ring's communicator, with the links a batch of (is_send, _, peer, _) entries
        uses set up: the outgoing ones first, since creating one never waits and attaching one
        waits for its peer to have created it."""
        comm, links = self._peer_links()
        for send, _, peer, _ in entries:
            if send:
                links.to(peer)
        for send, _, peer, _ in entries:
            if not send:
                links.from_(peer)
        return comm

    def _peer(self, peer, name):
        checks.root(peer, name, self.world_size)
        if peer == self.rank:
            raise ValueError(f"{name}={peer} is this rank: a rank cannot send to or receive from "
                             "itself")


def _split_counts(buf, splits, world_size, what):
    """Element counts per rank from split sizes along dim 0 (None: equal splits)."""
    shape = tuple(getattr(buf.source, "shape", (buf.numel,))) or (1,)
    rows = shape[0]
    row = buf.numel // rows if rows else 0
    if splits is None or len(splits) == 0:
        if rows % world_size:
            raise ValueError(f"{what} has {rows} rows along dim 0, not divisible by world_size "
                             f"{world_size}: give split sizes")
        return [rows // world_size * row] * world_size
    splits = [int(s) for s in splits]
    if len(splits) != world_size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"{what} split sizes {splits} must be {world_size} non-negative numbers "
                         f"summing to its {rows} rows along dim 0")
    return [s * row for s in splits]
