"""What a communicator's transports moved, as they counted it: :meth:`Communicator.stats`."""
from dataclasses import dataclass, field


@dataclass
class CommStats:
    """Traffic of one rank since the communicator was made or :meth:`Communicator.reset_stats`.

    Per-peer lists are indexed by rank. Bytes are payload bytes (no headers). A message passed
    on by reference (shared memory: allgather, broadcast) counts as sent to the rank it is passed
    to; a one-hop publication counts once in ``bytes_published`` when written and, for every rank
    that reads it (the writer included), as received from the writer. Waits are those that were
    not over at once; ``waits_ended`` says in which phase each ended (``spinning``,
    ``yielding``, ``sleeping`` on the futex). CUDA transports do not count (all zeros)."""

    bytes_sent: list = field(default_factory=list)
    bytes_received: list = field(default_factory=list)
    messages_sent: list = field(default_factory=list)
    messages_received: list = field(default_factory=list)
    bytes_published: int = 0
    publications: int = 0
    collectives: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    waits_ended: dict = field(default_factory=dict)
    sleeping_wait_seconds: float = 0.0

    @property
    def total_sent(self):
        return sum(self.bytes_sent)

    @property
    def total_received(self):
        return sum(self.bytes_received)

    def __add__(self, other):
        def add(a, b):
            return [x + y for x, y in zip(a, b)] if a and b else list(a or b)

        return CommStats(
            add(self.bytes_sent, other.bytes_sent), add(self.bytes_received, other.bytes_received),
            add(self.messages_sent, other.messages_sent),
            add(self.messages_received, other.messages_received),
            self.bytes_published + other.bytes_published, self.publications + other.publications,
            self.collectives + other.collectives, self.waits + other.waits,
            self.wait_seconds + other.wait_seconds,
            {k: self.waits_ended.get(k, 0) + other.waits_ended.get(k, 0)
             for k in {*self.waits_ended, *other.waits_ended}},
            self.sleeping_wait_seconds + other.sleeping_wait_seconds)


def from_traffic(traffic, collectives_before=0):
    """A CommStats from a _C.Communicator's traffic() dict."""
    return CommStats(
        traffic["bytes_sent"], traffic["bytes_received"], traffic["messages_sent"],
        traffic["messages_received"], traffic["bytes_published"], traffic["publications"],
        traffic["collectives"] - collectives_before, traffic["waits"], traffic["wait_seconds"],
        {"spinning": traffic["waits_ended_spinning"], "yielding": traffic["waits_ended_yielding"],
         "sleeping": traffic["waits_ended_sleeping"]},
        traffic["sleeping_wait_seconds"])
