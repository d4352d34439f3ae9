"""Why allreduce is a ring, measured: the same all_reduce done three ways over the same
shared-memory transport, on N = 2 ... 8 local ranks.

- ring: ringcomm's ring (reduce-scatter + allgather). Every rank sends 2(N-1)/N S, whatever N.
- master: master/worker. Every worker sends its S to rank 0, which adds them up and sends the
  sum back to each worker: the master sends and receives (N-1) S.
- everyone: every rank sends its S to every other rank (one all_to_all) and adds up what it
  received: every rank sends and receives (N-1) S.

Bytes are what the transport counted (Communicator.stats()), not computed. Times are the median
per call of the slowest rank, after warm-up; results are checked exactly (integer-valued
inputs). With more ranks than cores the ranks take turns on the cores, so times grow with N for
every method, and the total moved by all ranks weighs most (everyone: N(N-1) S; master:
2(N-1) S; ring: 2(N-1) S): compare the methods at each N. Beside the measurements, the alpha-beta model
(bench/cost_model.py's in-node link) predicts each method out to N = 4096.

    python bench/ring_vs_master.py                     # N = 2..8, 4 MiB float32, table + plot
    python bench/ring_vs_master.py --ranks 2,4,8 --size 16M --json out.json --plot out.png
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cost_model  # noqa: E402
from plots import save_figure  # noqa: E402
from sizes import parse_size  # noqa: E402
import run  # noqa: E402,F401  puts a source checkout's ringcomm on the path when not installed

import ringcomm  # noqa: E402

METHODS = ("ring", "master", "everyone")
MODEL_RANKS = [2 ** i for i in range(1, 13)]  # 2 ... 4096


def expected_bytes(method, n, size):
    """(sent, received) per call: (the master's, a worker's) for master, else every rank's."""
    if method == "ring":
        each = 2 * (n - 1) * size // n
        return {"rank": (each, each)}
    if method == "master":
        return {"master": ((n - 1) * size, (n - 1) * size), "worker": (size, size)}
    return {"rank": ((n - 1) * size, (n - 1) * size)}


def model_seconds(method, n, size, link):
    """The alpha-beta time of one all_reduce of `size` bytes on n ranks."""
    if method == "ring":
        return cost_model.ring(n, size, link)
    if method == "master":  # the master takes N-1 messages in, then sends N-1 out, one by one
        return 2 * (n - 1) * (link.alpha + size * link.beta)
    return (n - 1) * (link.alpha + size * link.beta)  # every link busy at once: per-rank bound


class Methods:
    """The three all_reduce methods on one rank, on buffers allocated once."""

    def __init__(self, comm, count):
        self.comm, self.n, self.rank = comm, comm.world_size, comm.rank
        self.data = torch.empty(count)
        self.incoming = torch.empty(count)
        self.spread = torch.empty(self.n * count)  # all_to_all: my tensor once per rank
        self.gathered = torch.empty(self.n * count)

    def ring(self):
        self.comm.all_reduce(self.data)

    def master(self):
        if self.rank == 0:
            for worker in range(1, self.n):  # in rank order: the same sum every time
                self.comm.recv(self.incoming, worker)
                self.data += self.incoming
            for worker in range(1, self.n):
                self.comm.send(self.data, worker)
        else:
            self.comm.send(self.data, 0)
            self.comm.recv(self.data, 0)

    def everyone(self):
        self.spread.view(self.n, -1).copy_(self.data)
        self.comm.all_to_all(self.gathered, self.spread)
        torch.sum(self.gathered.view(self.n, -1), 0, out=self.data)


def _fill(methods, rank):
    count = methods.data.numel()
    methods.data.copy_(torch.arange(count, dtype=torch.float32) % 251 + rank)


def _slowest(comm, values):
    """Every rank's list of numbers, elementwise max over ranks (an all_gather)."""
    mine = torch.tensor(values, dtype=torch.float64)
    every = torch.empty(comm.world_size * mine.numel(), dtype=torch.float64)
    comm.all_gather(every, mine)
    return every.view(comm.world_size, -1).max(0).values.tolist()


def rank_main(rank, n, args, store_path, result_path):
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, n)
    comm = ringcomm.Communicator.from_store(store, rank, n, timeout=args.timeout,
                                            algorithm="ring")
    count = args.size // 4
    methods = Methods(comm, count)
    expected = sum(torch.arange(count, dtype=torch.float32) % 251 + r for r in range(n))
    rows = []
    for name in METHODS:
        call = getattr(methods, name)
        _fill(methods, rank)
        for _ in range(args.warmup):
            call()
        comm.all_reduce(torch.zeros(1))  # line the ranks up
        comm.reset_stats()
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        stats = comm.stats()
        per_call = [stats.total_sent / args.iters, stats.total_received / args.iters]
        _fill(methods, rank)  # validate on fresh inputs, after timing
        call()
        wrong = int((methods.data != expected).sum())
        counted = torch.tensor(per_call + [wrong], dtype=torch.float64)
        every = torch.empty(n * counted.numel(), dtype=torch.float64)
        comm.all_gather(every, counted)
        slowest = _slowest(comm, times)
        rows.append({"method": name, "ranks": n, "size": args.size,
                     "time_us": statistics.median(slowest) * 1e6,
                     "sent": [int(x) for x in every.view(n, -1)[:, 0].tolist()],
                     "received": [int(x) for x in every.view(n, -1)[:, 1].tolist()],
                     "wrong": int(every.view(n, -1)[:, 2].sum())})
    comm.close()
    if rank == 0:
        Path(result_path).write_text(json.dumps(rows))


def measure(n, args):
    with tempfile.TemporaryDirectory(prefix="ringcomm-ring-vs-master-") as tmp:
        result = Path(tmp) / "rows.json"
        torch.multiprocessing.start_processes(
            rank_main, args=(n, args, f"{tmp}/store", str(result)), nprocs=n, join=True,
            start_method="fork")
        return json.loads(result.read_text())


def _size(nbytes):
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def _mb(nbytes):
    return f"{nbytes / 1e6:9.2f}"


def print_table(rows, size, cores):
    print(f"# all_reduce of {_size(size)} float32 three ways over shared memory; "
          f"{cores} cores: with more ranks than cores, ranks take turns")
    print("# bytes per call as counted by the transport (MB = 1e6 B): rank 0 and the other "
          "ranks' largest; expected: the formula")
    print(f"#{'ranks':>5} {'method':>9} {'r0 sent':>9} {'r0 recv':>9} {'others':>9} "
          f"{'expected':>9} {'expect r0':>9} {'time (us)':>11} {'#wrong':>6}")
    for row in rows:
        n, method = row["ranks"], row["method"]
        exp = expected_bytes(method, n, size)
        r0 = exp.get("master", exp.get("rank"))
        others = exp.get("worker", exp.get("rank"))
        print(f" {n:>5} {method:>9} {_mb(row['sent'][0])} {_mb(row['received'][0])} "
              f"{_mb(max(row['sent'][1:]))} {_mb(others[0])} {_mb(r0[0])} "
              f"{row['time_us']:>11.1f} {row['wrong']:>6}")


def model_rows(size, link):
    return [{"ranks": n, **{m: model_seconds(m, n, size, link) * 1e6 for m in METHODS}}
            for n in MODEL_RANKS]


def print_model(model, link):
    print(f"# alpha-beta model (alpha {link.alpha * 1e6:.1f} us, beta {1 / link.beta / 1e9:.2f} GB/s; "
          "bench/cost_model.py's in-node link), time per call in us")
    print(f"#{'ranks':>5} " + " ".join(f"{m:>12}" for m in METHODS) + f" {'master/ring':>12}")
    for row in model:
        print(f" {row['ranks']:>5} " + " ".join(f"{row[m]:>12.1f}" for m in METHODS) +
              f" {row['master'] / row['ring']:>12.1f}")


def plot(path, rows, model, size):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ranks = sorted({r["ranks"] for r in rows})
    for method, marker, color in zip(METHODS, "os^", ("C0", "C1", "C2")):
        mine = [r for r in rows if r["method"] == method]
        left.plot([r["ranks"] for r in mine], [max(r["sent"]) / size for r in mine], marker,
                  color=color, label=f"{method}: most any rank sent (counted)")
        right.plot([r["ranks"] for r in mine], [r["time_us"] for r in mine], marker,
                   color=color, label=f"{method}, measured")
        right.plot([m["ranks"] for m in model], [m[method] for m in model], "-", color=color,
                   label=f"{method}, model")
    grid = torch.linspace(min(ranks), max(ranks), 100).tolist()
    left.plot(grid, [2 * (n - 1) / n for n in grid], "k--", label="2(N-1)/N: the ring")
    left.plot(grid, [n - 1 for n in grid], "k:", label="N-1: master, everyone")
    left.set(xlabel="ranks N", ylabel="bytes sent per call / S", title="traffic per rank")
    right.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="time per call (us)",
              title="time: measured, and the alpha-beta model to 4096 ranks")
    left.legend(fontsize=8)
    right.legend(fontsize=7)
    save_figure(fig, path, f"all_reduce of {_size(size)}: "
                                   "ring against master/worker and everyone-to-everyone")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,3,4,5,6,7,8",
                        type=lambda s: [int(x) for x in s.split(",")],
                        help="world sizes, comma-separated (default 2..8)")
    parser.add_argument("--size", default="4M", type=parse_size,
                        help="bytes per rank, float32 (default 4M)")
    parser.add_argument("--iters", type=int, default=5, help="timed calls per method")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120, help="seconds any wait may take")
    parser.add_argument("--json", help="write the measurements and the model here")
    parser.add_argument("--plot", default="ring_vs_master.png",
                        help="the figure (default ring_vs_master.png; '' for none)")
    args = parser.parse_args(argv)
    if args.size % 4 or min(args.ranks) < 2:
        parser.error("--size must be whole float32 elements and every world size at least 2")
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = []
    for n in args.ranks:
        rows += measure(n, args)
    link = cost_model.Link(*cost_model.DEFAULT_INTRA)
    model = model_rows(args.size, link)
    print_table(rows, args.size, os.cpu_count())
    print_model(model, link)
    if args.json:
        Path(args.json).write_text(json.dumps({"measured": rows, "model": model,
                                               "model_link": {"alpha": link.alpha,
                                                              "beta": link.beta}}, indent=1))
    if args.plot:
        plot(args.plot, rows, model, args.size)
        print(f"# plot: {args.plot}")
    return rows


if __name__ == "__main__":
    main()
