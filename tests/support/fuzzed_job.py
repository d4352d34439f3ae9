"""One rank of tests/test_tcp_fuzz.py, started by torchrun on an emulated host while a stranger
(tcp_fuzzer.py) fuzzes its TCP listeners. Writes the addresses it listens on (from ringcomm's
INFO lines) to $FUZZ_DIR/addresses.<rank>, then runs all_reduce and a send/recv round the world
in a loop, checking every result exactly, until $FUZZ_DIR/done exists (with the argument
"shutdown": until the stranger's first round is done, $FUZZ_DIR/fuzzing; it then closes while
the stranger goes on). Prints one line "RESULT <json>": rounds, wrong results, resident memory
before and after the fuzzing."""
import json
import logging
import os
import re
import sys
import time

import torch
import torch.distributed as dist

import ringcomm

DIR = os.environ["FUZZ_DIR"]
TIMEOUT = 20


class Listeners(logging.Handler):
    """The addresses ringcomm's TCP links listen on, from its INFO lines."""

    def __init__(self):
        super().__init__()
        self.addresses = []

    def emit(self, record):
        found = re.search(r" listens for .* on (\S+)$", record.getMessage())
        if found:
            self.addresses.append(found.group(1))


def resident_kib():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def one_round(comm, n, step):
    wrong = 0
    for count in (2, 1 << 18):  # 8 B and 1 MiB
        t = torch.arange(count, dtype=torch.float32) + comm.rank + step
        comm.all_reduce(t)
        expected = torch.arange(count, dtype=torch.float32) * n + n * (n - 1) / 2 + n * step
        wrong += not torch.equal(t, expected)
    r = comm.rank
    out, got = torch.full((1000,), float(r + step)), torch.empty(1000)
    comm.batch_isend_irecv([ringcomm.P2POp("send", out, (r + 1) % n),
                            ringcomm.P2POp("recv", got, (r - 1) % n)])
    wrong += not torch.equal(got, torch.full((1000,), float((r - 1) % n + step)))
    return wrong


def main():
    shutdown = sys.argv[1:] == ["shutdown"]
    listeners = Listeners()
    logging.getLogger("ringcomm").addHandler(listeners)
    dist.init_process_group("gloo")
    comm = ringcomm.Communicator(timeout=TIMEOUT)
    n = comm.world_size
    wrong = sum(one_round(comm, n, step) for step in range(5))  # every link made
    before = resident_kib()
    path = os.path.join(DIR, f"addresses.{comm.rank}")
    with open(path + ".tmp", "w") as f:
        f.write("".join(a + "\n" for a in listeners.addresses))
    os.rename(path + ".tmp", path)
    rounds, started = 0, time.monotonic()
    while time.monotonic() - started < 60:
        # Ranks agree each round whether to stop, so that they all stop at the same one.
        stop = os.path.exists(os.path.join(DIR, "done")) or (
            shutdown and os.path.exists(os.path.join(DIR, "fuzzing")))
        flag = torch.tensor([int(stop)], dtype=torch.int64)
        comm.all_reduce(flag, op="max")
        if flag.item():
            break
        wrong += one_round(comm, n, rounds)
        rounds += 1
    after = resident_kib()
    comm.close()
    result = {"rank": comm.rank, "rounds": rounds, "wrong": wrong, "rss_before_kib": before,
              "rss_after_kib": after, "listening": listeners.addresses}
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
