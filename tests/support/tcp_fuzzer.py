"""A stranger on the network, for tests/test_tcp_fuzz.py: sends to ringcomm's TCP listeners
(addresses read from files the job writes) random bytes, truncated and oversized hellos and
frames, wrong magics, hellos for other worlds and with wrong secrets, and holds a few hundred
connections open that never say hello. Prints one line "FUZZED <json>": what it sent, by kind.

    python tcp_fuzzer.py ADDRESS_GLOB [--seconds S] [--until FILE] [--started FILE] [--idle N]
                         [--seed K]
"""
import argparse
import glob
import json
import os
import random
import resource
import socket
import struct
import sys
import time
from collections import Counter

MAGIC = 0x72696E67746370  # SocketTransport::kMagic, hellos and frames
HELLO = "<QiiII16s"  # magic, rank, world size, connection, connections, secret
FRAME = "<QIIQQ"  # magic, kind, unused, index, payload bytes (then the envelope)
ENVELOPE_BYTES = 64  # more than the envelope: what follows a header is read as payload


def hello(rng, rank=None, world=2, magic=MAGIC, secret=None):
    rank = rng.randrange(-2, 4) if rank is None else rank
    secret = rng.randbytes(16) if secret is None else secret
    return struct.pack(HELLO, magic, rank, world, rng.randrange(3), 2, secret)


def frame(rng, kind, payload_bytes):
    return struct.pack(FRAME, MAGIC, kind, 0, rng.randrange(4), payload_bytes) + bytes(
        ENVELOPE_BYTES)


def cases(rng):
    """(kind, bytes to send, whether to keep the connection open afterwards)."""
    h = hello(rng)
    return [
        ("random bytes", rng.randbytes(rng.randrange(1, 4096)), False),
        ("truncated hello", h[:rng.randrange(1, len(h))], rng.random() < 0.5),
        ("oversized hello", h + rng.randbytes(rng.randrange(1, 1 << 20)), False),
        ("wrong magic", hello(rng, magic=rng.getrandbits(64)), False),
        ("other world", hello(rng, rank=rng.randrange(8), world=rng.randrange(3, 9)), False),
        ("no secret", hello(rng, secret=bytes(16)), rng.random() < 0.5),
        ("wrong secret", hello(rng), False),
        ("hello and data frame", hello(rng) + frame(rng, 1, rng.choice([0, 8, 1 << 40])), False),
        ("hello and abort frame", hello(rng) + frame(rng, 2, 1 << 20) + bytes(1 << 10), False),
        ("bare frame", frame(rng, rng.randrange(4), rng.randrange(1 << 20)), False),
    ]


def send(address, data, keep, held, sent, kind):
    host, port = address.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=2)
        s.sendall(data)
    except OSError:  # refused (a job shutting down), reset by a listener that dropped it
        sent[kind + " (refused or reset)"] += 1
        return
    sent[kind] += 1
    if keep:
        held.append(s)
    else:
        s.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addresses", help="glob of files holding one ip:port a line")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--until", help="stop early once this file exists")
    p.add_argument("--started", help="a file to create after the first round")
    p.add_argument("--idle", type=int, default=300, help="connections that never say hello")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    deadline = time.monotonic() + 60
    while not glob.glob(args.addresses):
        if time.monotonic() > deadline:
            sys.exit("no addresses to fuzz")
        time.sleep(0.05)
    time.sleep(0.5)  # every rank writes its file
    targets = sorted({line.strip() for path in glob.glob(args.addresses)
                      for line in open(path) if line.strip()})
    sent, held = Counter(), []
    end = time.monotonic() + args.seconds
    rounds = 0
    while time.monotonic() < end and not (args.until and os.path.exists(args.until)):
        for address in targets:
            for kind, data, keep in cases(rng):
                send(address, data, keep, held, sent, kind)
            for _ in range(min(30, args.idle - sent["idle"])):  # spread over the targets
                send(address, b"", True, held, sent, "idle")
        rounds += 1
        if rounds == 1 and args.started:
            open(args.started, "w").close()
        time.sleep(0.05)  # the job's ranks share the machine's cores with this process
    for s in held:
        s.close()
    print("FUZZED " + json.dumps({"seed": seed, "rounds": rounds, "targets": targets,
                                  "sent": dict(sent)}), flush=True)


if __name__ == "__main__":
    main()
