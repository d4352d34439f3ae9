"""Point-to-point and all-to-all for Communicator: on CPU over shared-memory peer links set up
on first use, on CUDA over the ring's NCCL communicator."""
import time

import torch

from . import _C, checks
from .buffers import as_buffer

_ENVELOPE_TAG = (1 << 30) + 0xE1  # the debug envelopes' tag on the CPU links


class PointToPoint:
    """send, recv and all_to_all; mixed into :class:`ringcomm.Communicator`, whose ring, lock,
    rendezvous and options they use."""

    def send(self, tensor, dst, tag=0):
        """Sends ``tensor`` to rank ``dst``; returns once it is handed over (it may not have been
        received yet). Messages between two ranks are matched in order: the receiving rank's
        :meth:`recv` must name this rank, the same tag and the same element count and dtype, or it
        raises MismatchError.

        On CUDA tensors the call is ordered on the current stream and returns without waiting;
        as with NCCL, a send completes only together with its matching recv (two ranks that both
        send first may wait for each other until the timeout), and NCCL messages carry no header:
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
        if buf.device == "cuda":
            if self.debug:
                self._debug_envelope("send", dst, buf, tag)
            self._on_backend(buf, lambda comm, stream: comm.send(
                buf.address, buf.numel, buf.c_dtype, dst, int(tag), stream))
            return tensor
        comm, links = self._peer_links()
        links.to(dst)
        comm.send(buf.address, buf.numel, buf.c_dtype, dst, int(tag))
        return tensor

    def recv(self, tensor, src, tag=0):
        """Receives into ``tensor`` the next message rank ``src`` sent this rank (see :meth:`send`)."""
        buf = checks.writable(tensor, "tensor")
        self._peer(src, "src")
        if buf.device == "cuda":
            if self.debug:
                self._debug_envelope("recv", src, buf, tag)
            self._on_backend(buf, lambda comm, stream: comm.recv(
                buf.address, buf.numel, buf.c_dtype, src, int(tag), stream))
            return tensor
        comm, links = self._peer_links()
        links.from_(src)
        comm.recv(buf.address, buf.numel, buf.c_dtype, src, int(tag))
        return tensor

    def recv_any(self, tensor, tag=0):
        """Receives into ``tensor`` the next message any rank sent this rank with ``tag``, and
        returns the sender's rank (``torch.distributed.recv`` without ``src``). Ranks are looked
        at in turn, so a steady sender does not starve the others. CPU only: on CUDA, as on
        NCCL, the sender must be named.

        Example::

            src = comm.recv_any(buf, tag=7)
        """
        buf = checks.writable(tensor, "tensor")
        if buf.device == "cuda":
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
        if out.device == "cuda":  # every step one NCCL group, ordered on the current stream
            self._on_backend(out, lambda comm, stream: comm.all_to_all(
                out.address, inp.address, send_counts, recv_counts, out.c_dtype, stream))
            return output
        comm, links = self._peer_links() if self.world_size > 1 else (self._backend("cpu", -1), None)
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
        """debug=True where messages carry no header (NCCL): the sender first sends its tag,
        count and dtype over the CPU links, and the receiver compares them with its own before
        the payload is posted, raising MismatchError naming both (the sender's payload then
        waits for the timeout). Costs a CPU message per call, and the receive a host wait."""
        mine = torch.tensor([int(tag), buf.numel, int(buf.c_dtype)], dtype=torch.int64)
        comm, links = self._peer_links()
        if kind == "send":
            links.to(peer)
            comm.send(mine.data_ptr(), 3, _C.DataType.int64, peer, _ENVELOPE_TAG)
            return
        theirs = torch.empty(3, dtype=torch.int64)
        links.from_(peer)
        comm.recv(theirs.data_ptr(), 3, _C.DataType.int64, peer, _ENVELOPE_TAG)
        if theirs.tolist() != mine.tolist():
            def describe(tag, count, dtype):
                return f"tag {tag}, {count} x {_C.DataType(dtype).name}"
            raise _C.MismatchError(f"recv from rank {peer}: it sent {describe(*theirs.tolist())}, "
                                   f"rank {self.rank} expected {describe(*mine.tolist())}")

    def _peer_links(self):
        """The CPU ring's communicator, with its point-to-point links set up on first use."""
        with self._lock:
            comm = self._backend("cpu", -1)
            links = self._links
            if links is None:
                from .peer_links import PeerLinks

                links = self._links = PeerLinks(self._rendezvous, comm, self.options)
            return comm, links

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
