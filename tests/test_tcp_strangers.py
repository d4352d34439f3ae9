"""Strangers at a TCP listener (csrc/tcp/socket_greeting.cc), on real processes over 127.0.0.1:
a hello with the right magic but no secret, a wrong secret, a rank outside the world or a
connection already taken is dropped (and logged with its address) before it counts, and the
real peer still connects; idle and half-open connections, hundreds of them, are dropped after a
bounded time without starving the real peers or holding more than a bounded number of sockets.
Waits have generous deadlines against hangs; nothing here is a performance threshold."""
import os
import re
import secrets
import socket
import struct
import tempfile
import threading
import time

import torch
import torch.distributed as dist

from launcher import launch
from ringcomm import _C

MAGIC = 0x72696E67746370  # SocketTransport::kMagic
CONNECTIONS = 2
MAX_AWAITING = 64  # SocketTransport::kMaxAwaitingHello


def hello(rank, world, connection=0, connections=CONNECTIONS, secret=bytes(16), magic=MAGIC):
    """A SocketTransport::Hello as it goes on the wire."""
    return struct.pack("<QiiII16s", magic, rank, world, connection, connections, secret)


class StderrLog:
    """What this process writes to file descriptor 2 (the transport's drop lines go there)."""

    def __enter__(self):
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode(errors="replace")
        self.file.close()


def connected_transport(rank, n, timeout, key):
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set(f"{key}-secret", secrets.token_bytes(_C.SECRET_BYTES))
    secret = store.get(f"{key}-secret")
    transport = _C.SocketTransport(rank, n, 4096, 4, CONNECTIONS, timeout, "127.0.0.1", secret,
                                   log_drops=True)
    store.set(f"{key}-{rank}", transport.address)
    addresses = [store.get(f"{key}-{r}").decode() for r in range(n)]
    transport.connect(addresses, [f"host-{r}" for r in range(n)])
    comm = _C.Communicator(rank, n, transport, _C.CpuReducer(), 4096)
    return store, transport, comm, secret, addresses


def all_reduce_is_exact(comm, rank, n, count=3000):
    t = torch.arange(count, dtype=torch.float32) + rank
    comm.run(_C.Collective.all_reduce, t.data_ptr(), 0, count, _C.DataType.float32, _C.RedOp.sum,
             0, _C.Algorithm.ring, None, 0)
    return torch.equal(t, torch.arange(count, dtype=torch.float32) * n + n * (n - 1) // 2)


def wait_until(condition, what, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def closed_by_peer(s):
    """Whether the far end closed `s` (nothing is ever sent to strangers)."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def strangers(rank, n):
    with StderrLog() as log:
        store, transport, comm, secret, addresses = connected_transport(rank, n, 30, "strangers")
        results = {}
        if rank == 1:
            # Rank 0 has not connected yet: every stranger comes first, for rank 0's slots.
            host, port = addresses[1].split(":")
            cases = {"no secret": hello(0, n),
                     "wrong secret": hello(0, n, 1, secret=bytes(range(16))),
                     "wrong magic": hello(0, n, secret=secret, magic=MAGIC + 1),
                     "outside the world": hello(5, n, secret=secret),
                     "itself": hello(1, n, secret=secret)}
            made = {}
            for name, data in cases.items():
                made[name] = socket.create_connection((host, int(port)))
                made[name].sendall(data)
            wait_until(lambda: transport.dropped == len(cases), "the strangers to be dropped")
            wait_until(lambda: all(closed_by_peer(s) for s in made.values()), "their sockets")
            results["ports"] = {name: s.getsockname()[1] for name, s in made.items()}
            store.set("strangers-dropped", "1")
        store.get("strangers-dropped")
        results["exact"] = all_reduce_is_exact(comm, rank, n)
        if rank == 1:
            # With the secret, but rank 0's connection 0 is taken: dropped, the link unharmed.
            duplicate = socket.create_connection((host, int(port)))
            duplicate.sendall(hello(0, n, 0, secret=secret))
            wait_until(lambda: transport.dropped == len(cases) + 1, "the duplicate's drop")
            results["ports"]["duplicate"] = duplicate.getsockname()[1]
            store.set("duplicate-dropped", "1")
        store.get("duplicate-dropped")
        results["exact after"] = all_reduce_is_exact(comm, rank, n)
        results["dropped"] = transport.dropped
        comm.close()
        del comm, transport
    results["log"] = log.text
    return results


def test_strangers_without_the_secret_cannot_take_a_slot_and_the_real_peer_still_connects():
    r0, r1 = launch(2, strangers, timeout=120)
    assert r0["exact"] and r1["exact"] and r0["exact after"] and r1["exact after"]
    assert r0["dropped"] == 0 and r1["dropped"] == 6
    reasons = {"no secret": "its hello (as rank 0) lacks this communicator's secret",
               "wrong secret": "its hello (as rank 0) lacks this communicator's secret",
               "wrong magic": "its hello has the wrong magic",
               "outside the world": "its hello names rank 5, not a peer in this 2-rank world",
               "itself": "its hello names rank 1, not a peer in this 2-rank world",
               "duplicate": "rank 0's connection 0 is connected already"}
    for name, port in r1["ports"].items():
        line = rf"ringcomm INFO rank 1 of 2 \(listening on 127\.0\.0\.1:\d+\) dropped a " \
               rf"connection from 127\.0\.0\.1:{port}: {re.escape(reasons[name])}"
        assert re.search(line, r1["log"]), (name, r1["log"])
    assert "dropped" not in r0["log"]


def flood(rank, n):
    timeout = 3  # the hello's bound is the timeout when shorter than 5 s
    with StderrLog() as log:
        store, transport, comm, _, addresses = connected_transport(rank, n, timeout, "flood")
        results = {}
        if rank == 1:
            host, port = addresses[1].split(":")
            sockets_before = sockets_open()
            idle = [socket.create_connection((host, int(port))) for _ in range(300)]
            half = [socket.create_connection((host, int(port))) for _ in range(20)]
            for s in half:
                s.sendall(hello(0, n)[:10])  # a hello cut short
            # Accepted and not yet dropped: at most the queue of those awaiting their hello.
            wait_until(lambda: transport.dropped >= len(idle) + len(half) - MAX_AWAITING,
                       "the oldest to be pushed out")
            time.sleep(0.1)  # the progress thread closes what it dropped at its next round
            results["held"] = sockets_open() - sockets_before - len(idle) - len(half)
            store.set("flooded", "1")
            # More come while the real peers connect and run (fewer than would push the
            # half-open ones out: those must go by the hello's deadline).
            more = []
            stop = threading.Event()

            def keep_flooding():
                while not stop.is_set() and len(more) < 40:
                    more.append(socket.create_connection((host, int(port))))
                    time.sleep(0.002)

            flooder = threading.Thread(target=keep_flooding)
            flooder.start()
        store.get("flooded")
        results["exact"] = all(all_reduce_is_exact(comm, rank, n) for _ in range(20))
        if rank == 1:
            stop.set()
            flooder.join()
            everyone = idle + half + more
            wait_until(lambda: transport.dropped == len(everyone), "every idle one to go")
            wait_until(lambda: all(closed_by_peer(s) for s in everyone), "their sockets")
            results["dropped"], results["flooded"] = transport.dropped, len(everyone)
            results["half port"] = half[0].getsockname()[1]
            for s in everyone:
                s.close()
        comm.close()
        del comm, transport
    results["log"] = log.text
    return results


def sockets_open():
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


def test_idle_and_half_open_connections_are_dropped_and_a_flood_does_not_starve_the_peers():
    r0, r1 = launch(2, flood, timeout=120)
    assert r0["exact"] and r1["exact"]
    assert r1["dropped"] == r1["flooded"] >= 320
    assert r1["held"] <= MAX_AWAITING, r1["held"]
    assert re.search(rf"dropped a connection from 127\.0\.0\.1:{r1['half port']}: no complete "
                     r"hello within 3 s", r1["log"]), r1["log"][-2000:]
    assert f"it was the oldest of {MAX_AWAITING} connections awaiting their hello" in r1["log"]
    # Every drop of a few hundred is named (a budget of lines keeps floods from filling disks).
    assert r1["log"].count("dropped a connection") == r1["dropped"]


def test_a_flood_of_drops_is_logged_from_a_budget_that_refills():
    with StderrLog() as log:
        transport = _C.SocketTransport(0, 2, 4096, 4, CONNECTIONS, 30, "127.0.0.1",
                                       secrets.token_bytes(_C.SECRET_BYTES), True)
        host, port = transport.address.split(":")
        flood = 800  # more than the budget's 500 lines
        for _ in range(flood):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(hello(1, 2))  # no secret
        wait_until(lambda: transport.dropped == flood, "the flood's drops")
        # Once the budget refills, a later drop is logged with the count of those that were not.
        with open(f"/proc/self/fd/{log.file.fileno()}") as written:
            def summarized():
                with socket.create_connection((host, int(port))) as s:
                    s.sendall(hello(1, 2))
                time.sleep(0.05)
                written.seek(0)
                return "more since the last line)" in written.read()

            wait_until(summarized, "a line that counts the unlogged drops")
        dropped = transport.dropped
        del transport
    lines = log.text.count("dropped a connection")
    assert lines < dropped, (lines, dropped)
    assert re.search(r"\(and \d+ more since the last line\)", log.text)
