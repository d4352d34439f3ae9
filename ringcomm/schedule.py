"""The schedules (ring and one-hop plans) as data, and a text view of them (steps down, ranks
across)."""
from dataclasses import dataclass

from . import _C
from .buffers import as_c_dtype
from .options import ALGORITHM_COLLECTIVES, check_algorithm


@dataclass(frozen=True)
class Step:
    """One step of one rank; see csrc/include/ringcomm/schedule.h for the semantics. `kind` is
    its name as NCCL names ring steps (send, recv, recvReduceSend, recvReduceCopySend,
    recvCopySend, ...; publish and read for the one-hop algorithms)."""

    kind: str
    recv_from: int
    send_to: int
    read_from: int  # one-hop: whose publication of read_phase is read
    read_phase: int
    published_chunk: int  # the chunk that publication covers (-1: every chunk)
    publish_phase: int  # one-hop: the phase the value is published in
    chunk: int
    offset: int
    count: int
    reduce: bool
    store: bool
    finalize: bool
    ack: bool

    def describe(self):
        chunk = "ack" if self.ack else "all" if self.chunk < 0 else f"c{self.chunk}"
        if self.recv_from < 0 and self.read_from < 0:
            if self.publish_phase >= 0:
                return f"{chunk} =>p{self.publish_phase}"
            return f"{chunk} ->{self.send_to}"
        if self.read_from >= 0:
            text = f"{chunk} <={self.read_from}:p{self.read_phase}"
        else:
            text = f"{chunk} <-{self.recv_from}"
        text += " +" if self.reduce else ""
        if self.store:
            text += " keep"
        if self.send_to >= 0:
            text += f" ->{self.send_to}"
        if self.publish_phase >= 0:
            text += f" =>p{self.publish_phase}"
        return text


@dataclass(frozen=True)
class Schedule:
    """Every rank's plan for one collective. ``str()`` draws it as a table.

    Example::

        >>> print(ringcomm.schedule("all_reduce", world_size=3, count=12))
    """

    collective: str
    world_size: int
    count: int
    root: int
    algorithm: str
    chunks: tuple  # (offset, count) per chunk of the logical buffer
    steps: tuple  # steps[rank] = tuple of Step

    def __str__(self):
        chunks = " ".join(f"c{i}=[{o},{o + n})" for i, (o, n) in enumerate(self.chunks))
        header = f"{self.collective}: {self.world_size} ranks, count {self.count}"
        if _C.COLLECTIVES[self.collective]["root"]:
            header += f", root {self.root}"
        if self.algorithm != "ring":
            header += f", {self.algorithm} (each round of publications runs every step)"
        lines = [header, f"chunks: {chunks}",
                 "legend: cK ->r send chunk K to rank r; <-r receive from r; + reduce; keep store; "
                 "ack: empty message closing a chain; =>pP publish in phase P; <=r:pP read "
                 "rank r's publication of phase P"]
        cells = [[s.describe() for s in rank_steps] for rank_steps in self.steps]
        width = max([len("rank 00")] + [len(c) for col in cells for c in col]) + 2
        lines.append("step  " + "".join(f"rank {r}".ljust(width) for r in range(self.world_size)))
        for i in range(max((len(c) for c in cells), default=0)):
            row = "".join((col[i] if i < len(col) else "").ljust(width) for col in cells)
            lines.append(f"{i:>4}  " + row.rstrip())
        return "\n".join(lines)


def schedule(collective="all_reduce", world_size=4, count=None, root=0, dtype="float32",
             wire_dtype=None, algorithm="ring"):
    """The plan every rank follows for ``collective`` (a name as in torch.distributed) with
    ``algorithm`` ("ring", "one_shot", "two_shot": ringcomm.options.ALGORITHM_COLLECTIVES says
    which runs what).

    ``count`` is the tensor's elements for a collective that runs in place (all_reduce,
    broadcast, reduce: ``_C.COLLECTIVES``' layout), and one rank's block
    for the others (default: one element per rank). ``dtype`` and ``wire_dtype`` (torch dtypes or
    names) matter to all_reduce only: its chunks start on 16-byte boundaries of both.

    Example::

        >>> print(ringcomm.schedule("reduce_scatter", world_size=4))
        >>> print(ringcomm.schedule("all_reduce", world_size=3, algorithm="two_shot"))
    """
    planned = {kind.name: kind for kind in _C.PLANNED_COLLECTIVES}
    kind = planned.get(collective)
    if kind is None:
        raise ValueError(f"no ring schedule for {collective!r}; one of {list(planned)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if count is None:  # one element per rank: the whole tensor's, or each rank's block
        count = world_size if _C.COLLECTIVES[collective]["layout"] == "in_place" else 1
    if algorithm == "auto" or collective not in ALGORITHM_COLLECTIVES.get(algorithm, (collective,)):
        runs = [a for a, kinds in ALGORITHM_COLLECTIVES.items() if collective in kinds and a != "auto"]
        raise ValueError(f"no {algorithm!r} schedule for {collective!r}; one of {runs}")
    c_algorithm = _C.Algorithm.__members__[check_algorithm(algorithm)]
    c_dtype = as_c_dtype(dtype)
    c_wire = c_dtype if wire_dtype is None else as_c_dtype(wire_dtype)
    plans = [_C.make_plan(kind, rank, world_size, count, root, c_dtype, c_wire, c_algorithm)
             for rank in range(world_size)]
    steps = tuple(tuple(Step(**s) for s in plan["steps"]) for plan in plans)
    chunks = tuple(tuple(c) for c in plans[0]["chunks"])
    return Schedule(collective, world_size, count, root, algorithm, chunks, steps)
