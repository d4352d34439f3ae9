"""Point-to-point and all-to-all for a Communicator: on CPU over the CPU ring's point-to-point
links (shared memory inside a host, TCP between hosts) set up on first use; on CUDA over the
ring's own NCCL communicator, ordered on the caller's stream."""
import time
from typing import NamedTuple

import torch

from . import _C, checks
from .buffers import as_buffer
from .transport import backends

_ENVELOPE_TAG = (1 << 30) + 0xE1  # the debug envelopes' tag on the CPU links


class P2POp(NamedTuple):
    """One operation of :meth:`Communicator.batch_isend_irecv`: ``op`` is ``"send"`` (``tensor``
    to rank ``peer``) or ``"recv"`` (into ``tensor`` from rank ``peer``)."""

    op: str
    tensor: object
    peer: int
    tag: int = 0


class PointToPoint:
    """A Communicator's send, recv, recv_any, batch_isend_irecv and all_to_all (documented
    there), on its `router` (routing.Router): the CPU ring's links, or the device backend."""

    def __init__(self, router, rank, world_size, timeout, debug):
        self._router = router
        self.rank, self.world_size, self.timeout, self.debug = rank, world_size, timeout, debug
        self._any_source_start = 0  # the rank a receive from any source looks at first

    def send(self, tensor, dst, tag):
        buf = as_buffer(tensor, "tensor")
        self._peer(dst, "dst")
        if _on_ring(buf):
            if self.debug:
                self._debug_envelope("send", dst, buf, tag)
            self._router.call_on_device(buf, lambda comm, stream: comm.send(
                buf.address, buf.numel, buf.c_dtype, dst, int(tag), stream))
            return tensor
        comm, links = self._router.peer_links()
        links.to(dst)
        comm.send(buf.address, buf.numel, buf.c_dtype, dst, int(tag))
        return tensor

    def recv(self, tensor, src, tag):
        buf = checks.writable(tensor, "tensor")
        self._peer(src, "src")
        if _on_ring(buf):
            if self.debug:
                self._debug_envelope("recv", src, buf, tag)
            self._router.call_on_device(buf, lambda comm, stream: comm.recv(
                buf.address, buf.numel, buf.c_dtype, src, int(tag), stream))
            return tensor
        comm, links = self._router.peer_links()
        links.from_(src)
        comm.recv(buf.address, buf.numel, buf.c_dtype, src, int(tag))
        return tensor

    def recv_any(self, tensor, tag):
        buf = checks.writable(tensor, "tensor")
        if _on_ring(buf):
            raise NotImplementedError("recv from any source is not supported on CUDA tensors "
                                      "(NCCL needs the sending rank): name src")
        if self.world_size == 1:
            raise ValueError("recv from any source: this communicator has no other rank")
        comm, links = self._router.peer_links()
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

    def batch_isend_irecv(self, ops):
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
        if _on_ring(first):  # one NCCL group, ordered on the current stream
            if self.debug:
                self._debug_envelopes(entries)
            self._router.call_on_device(first, lambda comm, stream: comm.send_recv_batch(
                fields, stream))
            return
        self._batch_links(entries).send_recv_batch(fields)

    def all_to_all(self, output, input, output_split_sizes, input_split_sizes):
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        if out.overlaps(inp):
            raise ValueError("all_to_all: input and output must not overlap")
        send_counts = _split_counts(inp, input_split_sizes, self.world_size, "input")
        recv_counts = _split_counts(out, output_split_sizes, self.world_size, "output")
        if _on_ring(out):  # every step one NCCL group, ordered on the current stream
            self._router.call_on_device(out, lambda comm, stream: comm.all_to_all(
                out.address, inp.address, send_counts, recv_counts, out.c_dtype, stream))
            return output
        if self.world_size > 1:
            comm, links = self._router.peer_links()
            for peer in range(self.world_size):
                if peer != self.rank:
                    links.to(peer)
            for peer in range(self.world_size):
                if peer != self.rank:
                    links.from_(peer)
        else:
            comm = self._router.communicator_for("cpu", -1)
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

    def _batch_links(self, entries):
        """The CPU ring's communicator, with the links a batch of (is_send, _, peer, _) entries
        uses set up: the outgoing ones first, since creating one never waits and attaching one
        waits for its peer to have created it."""
        comm, links = self._router.peer_links()
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


def _on_ring(buf):
    """Whether point-to-point on this buffer's device goes over the ring's own communicator
    (NCCL) rather than the CPU's point-to-point links."""
    return backends.for_device(buf.device).p2p_on_ring


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
