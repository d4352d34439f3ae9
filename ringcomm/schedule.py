"""The ring schedule as data, and a text view of it (steps down, ranks across)."""
from dataclasses import dataclass

from . import _C
from .buffers import as_c_dtype


@dataclass(frozen=True)
class Step:
    """One step of one rank; see csrc/include/ringcomm/schedule.h for the semantics."""

    recv_from: int
    send_to: int
    chunk: int
    offset: int
    count: int
    reduce: bool
    store: bool
    finalize: bool
    ack: bool

    def describe(self):
        chunk = "ack" if self.ack else "all" if self.chunk < 0 else f"c{self.chunk}"
        if self.recv_from < 0:
            return f"{chunk} ->{self.send_to}"
        text = f"{chunk} <-{self.recv_from}" + (" +" if self.reduce else "")
        if self.store:
            text += " keep"
        if self.send_to >= 0:
            text += f" ->{self.send_to}"
        return text


@dataclass(frozen=True)
class Schedule:
    """Every rank's plan for one collective. ``str()`` draws it as a table.

    Example::

        >>> print(ringcomm.schedule("all_reduce", world_size=3, count=12))
    """

    primitive: str
    world_size: int
    count: int
    root: int
    chunks: tuple  # (offset, count) per chunk of the logical buffer
    steps: tuple  # steps[rank] = tuple of Step

    def __str__(self):
        chunks = " ".join(f"c{i}=[{o},{o + n})" for i, (o, n) in enumerate(self.chunks))
        header = f"{self.primitive}: {self.world_size} ranks, count {self.count}"
        if self.primitive in ("broadcast", "reduce", "gather", "scatter"):
            header += f", root {self.root}"
        lines = [header, f"chunks: {chunks}",
                 "legend: cK ->r send chunk K to rank r; <-r receive from r; + reduce; keep store; "
                 "ack: empty message closing a chain"]
        cells = [[s.describe() for s in rank_steps] for rank_steps in self.steps]
        width = max([len("rank 00")] + [len(c) for col in cells for c in col]) + 2
        lines.append("step  " + "".join(f"rank {r}".ljust(width) for r in range(self.world_size)))
        for i in range(max((len(c) for c in cells), default=0)):
            row = "".join((col[i] if i < len(col) else "").ljust(width) for col in cells)
            lines.append(f"{i:>4}  " + row.rstrip())
        return "\n".join(lines)


def schedule(primitive="all_reduce", world_size=4, count=None, root=0, dtype="float32",
             wire_dtype=None):
    """The plan every rank follows for ``primitive`` (a name as in torch.distributed).

    ``count`` is the tensor's elements for all_reduce, broadcast and reduce, and one rank's block
    for the others (default: one element per rank). ``dtype`` and ``wire_dtype`` (torch dtypes or
    names) matter to all_reduce only: its chunks start on 16-byte boundaries of both.

    Example::

        >>> print(ringcomm.schedule("reduce_scatter", world_size=4))
    """
    planned = {kind.name: kind for kind in _C.PLANNED_PRIMITIVES}
    kind = planned.get(primitive)
    if kind is None:
        raise ValueError(f"no ring schedule for {primitive!r}; one of {list(planned)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if count is None:
        count = world_size if primitive in ("all_reduce", "broadcast", "reduce") else 1
    c_dtype = as_c_dtype(dtype)
    c_wire = c_dtype if wire_dtype is None else as_c_dtype(wire_dtype)
    plans = [_C.make_plan(kind, rank, world_size, count, root, c_dtype, c_wire)
             for rank in range(world_size)]
    steps = tuple(tuple(Step(**s) for s in plan["steps"]) for plan in plans)
    chunks = tuple(tuple(c) for c in plans[0]["chunks"])
    return Schedule(primitive, world_size, count, root, chunks, steps)
