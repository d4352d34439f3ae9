"""The CPU backend: a shared-memory ring between the processes of one host."""
import os
import socket

from . import _C, backends


def create(rendezvous, options):
    """A _C.Communicator over shared memory, configured by resolved CommOptions; every rank of
    the group calls this together."""
    rank, size = rendezvous.rank, rendezvous.world_size
    transport = _C.ShmTransport(rank, size, options.slot_bytes, options.slot_count,
                                options.timeout, options.spin_us, options.yield_us,
                                options.publish_bytes)
    if size > 1:
        rendezvous.publish("shm", f"{_shared_memory()}\n{transport.channel_name}")
        published = [rendezvous.read("shm", r).decode().split("\n", 1) for r in range(size)]
        _check_one_shared_memory(rank, [where for where, _ in published])
        try:
            # Every rank maps every channel and publication board: allgather and broadcast
            # forward messages by reference, one-hop algorithms read publications where they
            # were written.
            transport.connect([names for _, names in published])
            rendezvous.barrier("shm-attached")
        finally:
            # Every rank has them mapped, or set-up failed (a peer died or never came) and
            # nobody will: after this, /dev/shm holds nothing of ours, whatever happens to any
            # process.
            transport.unlink_names()
    return _C.Communicator(rank, size, transport, _C.CpuReducer(),
                           options.slice_bytes or options.slot_bytes,
                           thresholds=options.thresholds())


def _shared_memory():
    """"<host name> <boot id>/<device of /dev/shm>": processes can map each other's segments
    when the last part is the same (one kernel, one /dev/shm mount); the host names the machine
    in errors."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        device = os.stat("/dev/shm").st_dev
    except OSError:
        boot, device = "unknown", "unknown"
    return f"{socket.gethostname()} {boot}/{device}"


def _check_one_shared_memory(rank, where):
    """Raises, naming the hosts, when ranks see different shared memory (the one case where
    mapping a peer's segment fails because of where the ranks run)."""
    mine = where[rank].split()[-1]
    others = [r for r, w in enumerate(where) if w.split()[-1] != mine]
    if others:
        seen = "; ".join(f"rank {r}: host {w.split()[0]}, /dev/shm {w.split()[-1]}"
                         for r, w in enumerate(where))
        raise _C.RingcommError(f"ranks {others} do not share rank {rank}'s shared memory "
                               f"({seen}): ringcomm's CPU path needs every rank on one host, "
                               f"seeing one /dev/shm")


backends.register(backends.Backend(
    "cpu-shm", "cpu", lambda rendezvous, index, options, ordinal: create(rendezvous, options),
    available=lambda: True))
