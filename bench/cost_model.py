"""An alpha-beta cost model of all_reduce algorithms: where the flat ring stops being the right
choice, on paper, for N up to 4096 ranks and sizes from 8 B to 1 GiB.

    python bench/cost_model.py                                  # table of the best algorithm
    python bench/cost_model.py --calibrate r.json --plot best.png
    python bench/cost_model.py --ranks-per-node 8 --inter-alpha-us 5 --inter-gbps 25

A message of m bytes over one link costs alpha + m * beta (Hockney). Reducing m bytes costs
m * gamma. Ranks in one node are fully connected (shared memory, NVLink): an algorithm that
reads every peer at once pays one alpha per phase there. Between nodes each rank has one port.
Formulas follow Thakur, Rabenseifner and Gropp (2005), "Optimization of collective
communication operations in MPICH":

  ring              2(N-1) alpha + 2(N-1)/N S beta + (N-1)/N S gamma
  one-shot          (in node) alpha + (N-1) S beta + (N-1) S gamma
  two-shot          (in node) 2 alpha + 2(N-1)/N S beta + (N-1)/N S gamma
  recursive doubling  log2(N) (alpha + S beta + S gamma)
  halving-doubling  2 log2(N) alpha + 2(N-1)/N S beta + (N-1)/N S gamma   (Rabenseifner)
  two-level ring    ring reduce-scatter in the node, G rings across nodes on S/G each (one per
                    local rank, in parallel), ring all-gather in the node

Non-power-of-two N costs recursive doubling and halving-doubling one extra exchange of S bytes
before and after (the ranks beyond the largest power of two fold in). A flat algorithm that
spans several nodes runs at the pace of its slowest link: the inter-node alpha and beta.

--calibrate-inter fits the between-node alpha and beta the same way from a run across hosts
(tools/emulated_hosts.py ... bench/run.py --json: ringcomm's two-level all_reduce, time =
in-node reduce-scatter and all-gather at the in-node link + a ring of the hosts on S/G), so the
beta is what one local rank gets of the host's link when all of them send at once.

--calibrate fits the in-node alpha and beta by least squares from a bench/run.py or bench/tune.py
--json file (ring all_reduce records: time = 2(N-1) alpha + 2(N-1)/N S beta), so the in-node
column of the model is the measured machine's; beta then includes the reduction (gamma = 0).
It also fits each other measured algorithm to its own formula (one-shot, two-shot): where its
alpha and beta differ from the ring's, the model's crossovers differ from the measured ones.

What the model leaves out: in pure alpha-beta terms halving-doubling has the ring's bandwidth
term and fewer latency terms, so the ring never wins outright here. What keeps rings in NCCL is
outside the model: the far exchanges of halving-doubling contend on oversubscribed networks, and
a ring pipelines slices over several channels. Read the plot as "where the ring's latency
stops being affordable", not as a replacement for measuring.
"""
import argparse
import json
import math
from dataclasses import dataclass, replace

import numpy as np

# In a node: the CPU all_reduce table of docs/benchmarks.md (2 cores, shared memory, fp32): 8 B
# in 17.9 us at 2 ranks (2 steps) and 64 MiB in 19.9 ms (2 x 32 MiB moved and reduced per rank).
# Between nodes: a 200 Gb/s InfiniBand port, 5 us per message, assumed.
DEFAULT_INTRA = (9.0e-6, 19.9e-3 / (64 << 20))
DEFAULT_INTER = (5.0e-6, 1 / 25e9)

SIZES = [8 << (3 * i) for i in range(10)]  # 8 B, 64 B, ... 1 GiB
RANKS = [2 ** i for i in range(1, 13)]                  # 2 ... 4096


@dataclass(frozen=True)
class Link:
    alpha: float  # seconds per message
    beta: float   # seconds per byte
    gamma: float = 0.0  # seconds per byte reduced


@dataclass(frozen=True)
class Machine:
    intra: Link
    inter: Link
    ranks_per_node: int

    def link(self, ranks):
        """The bottleneck link of a flat algorithm over `ranks` ranks."""
        return self.intra if ranks <= self.ranks_per_node else self.inter


def ring(n, size, link):
    if n == 1:
        return 0.0
    share = (n - 1) / n * size
    return 2 * (n - 1) * link.alpha + 2 * share * link.beta + share * link.gamma


def ring_reduce_scatter(n, size, link):
    share = (n - 1) / n * size
    return (n - 1) * link.alpha + share * (link.beta + link.gamma)


def ring_all_gather(n, size, link):
    return (n - 1) * link.alpha + (n - 1) / n * size * link.beta


def one_shot(n, size, link):
    return link.alpha + (n - 1) * size * (link.beta + link.gamma)


def two_shot(n, size, link):
    share = (n - 1) / n * size
    return 2 * link.alpha + 2 * share * link.beta + share * link.gamma


def _fold(n, size, link):
    """Cost of folding the ranks beyond the largest power of two in and out again."""
    return 0.0 if n & (n - 1) == 0 else 2 * (link.alpha + size * link.beta) + size * link.gamma


def recursive_doubling(n, size, link):
    p = 1 << int(math.log2(n))
    return math.log2(p) * (link.alpha + size * (link.beta + link.gamma)) + _fold(n, size, link)


def halving_doubling(n, size, link):
    p = 1 << int(math.log2(n))
    share = (p - 1) / p * size
    steps = 2 * math.log2(p) * link.alpha + 2 * share * link.beta + share * link.gamma
    return steps + _fold(n, size, link)


def two_level(n, size, machine):
    g = min(n, machine.ranks_per_node)
    nodes = math.ceil(n / g)
    inside = ring_reduce_scatter(g, size, machine.intra) + ring_all_gather(g, size, machine.intra)
    return inside + ring(nodes, size / g, machine.inter)


def predictions(n, size, machine):
    """{algorithm: seconds} for an all_reduce of `size` bytes on `n` ranks."""
    link = machine.link(n)
    times = {
        "ring": ring(n, size, link),
        "recursive-doubling": recursive_doubling(n, size, link),
        "halving-doubling": halving_doubling(n, size, link),
    }
    if n <= machine.ranks_per_node:  # every rank reads every peer at once: one node only
        times["one-shot"] = one_shot(n, size, link)
        times["two-shot"] = two_shot(n, size, link)
    else:
        times["two-level"] = two_level(n, size, machine)
    return times


def best(n, size, machine):
    times = predictions(n, size, machine)
    name = min(times, key=times.get)
    return name, times[name], times["ring"]


# Measured algorithm names (ringcomm.options.ALGORITHMS) -> the model's formula for them.
FORMULAS = {"ring": ring, "one_shot": one_shot, "two_shot": two_shot,
            "recursive_doubling": recursive_doubling}


def load_records(path):
    """Records from a bench/run.py JSON (a list) or a bench/tune.py JSON (under "records")."""
    with open(path) as f:
        data = json.load(f)
    return data["records"] if isinstance(data, dict) else data


def measured_algorithms(records):
    """The algorithms with all_reduce records that FORMULAS can fit, ring first."""
    names = {_algorithm(r["impl"]) for r in records if r.get("collective") == "all_reduce"}
    return [a for a in FORMULAS if a in names]


def _algorithm(impl):
    """A record's algorithm: "ringcomm-NAME" (bench --algorithm), plain "ringcomm" the ring."""
    return "ring" if impl == "ringcomm" else impl.removeprefix("ringcomm-")


def fit(records, algorithm="ring"):
    """(alpha, beta) from ringcomm all_reduce records of `algorithm` by least squares on its
    formula, which is linear in both (ring: time = 2(N-1) alpha + 2(N-1)/N S beta). Raises if
    the records cannot determine both."""
    formula = FORMULAS[algorithm]
    rows = [r for r in records if r.get("collective") == "all_reduce"
            and _algorithm(r.get("impl", "")) == algorithm and r.get("nranks", 1) > 1
            and r.get("time_us")]
    if len({r["size"] for r in rows}) < 2:
        raise ValueError(f"calibration needs {algorithm} all_reduce records at two sizes or more")
    a = np.array([[formula(r["nranks"], r["size"], Link(1.0, 0.0)),
                   formula(r["nranks"], r["size"], Link(0.0, 1.0))] for r in rows])
    t = np.array([r["time_us"] * 1e-6 for r in rows])
    # Relative error matters (8 B and 64 MiB differ by 1000x): weight each row by 1/time.
    w = 1 / t
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"calibration gave alpha={alpha:.3g} s, beta={beta:.3g} s/B: the "
                         f"records do not follow {algorithm}'s cost; measure a wider size range")
    return float(alpha), float(beta)


def fit_inter(records, machine):
    """(alpha, beta) between nodes from ringcomm all_reduce records across hosts of
    `machine.ranks_per_node` ranks each, by least squares on two_level with the in-node link
    known (its part of each time is taken off first)."""
    g = machine.ranks_per_node
    rows = [r for r in records if r.get("collective") == "all_reduce"
            and _algorithm(r.get("impl", "")) == "ring" and r.get("nranks", 1) > g
            and r.get("time_us")]
    if len({r["size"] for r in rows}) < 2:
        raise ValueError(f"calibration needs all_reduce records across hosts of {g} ranks "
                         "at two sizes or more")
    inside = np.array([two_level(r["nranks"], r["size"], replace(machine, inter=Link(0.0, 0.0)))
                       for r in rows])
    a = np.array([[ring(math.ceil(r["nranks"] / g), r["size"] / g, Link(1.0, 0.0)),
                   ring(math.ceil(r["nranks"] / g), r["size"] / g, Link(0.0, 1.0))] for r in rows])
    t = np.array([r["time_us"] * 1e-6 for r in rows]) - inside
    w = 1 / np.array([r["time_us"] * 1e-6 for r in rows])
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"calibration gave alpha={alpha:.3g} s, beta={beta:.3g} s/B between "
                         "nodes: measure a wider size range")
    return float(alpha), float(beta)


def _size(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def table(machine, ranks=RANKS, sizes=SIZES):
    """One line per (N, size): the best algorithm, its time, and its speed-up over the ring."""
    lines = [f"{'ranks':>6} {'size':>6}  {'best':<19} {'time (us)':>12} {'ring (us)':>12} "
             f"{'ring/best':>9}"]
    for n in ranks:
        for size in sizes:
            name, t, t_ring = best(n, size, machine)
            lines.append(f"{n:>6} {_size(size):>6}  {name:<19} {t * 1e6:>12.1f} "
                         f"{t_ring * 1e6:>12.1f} {t_ring / t:>9.2f}")
    return "\n".join(lines)


def plot(path, machine, ranks=RANKS, sizes=SIZES):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    names = ["ring", "one-shot", "two-shot", "recursive-doubling", "halving-doubling", "two-level"]
    grid = np.array([[names.index(best(n, s, machine)[0]) for s in sizes] for n in ranks])
    speedup = np.array([[best(n, s, machine)[2] / best(n, s, machine)[1] for s in sizes]
                        for n in ranks])
    fig, ax = plt.subplots(figsize=(11, 6))
    colors = ListedColormap(plt.get_cmap("tab10").colors[: len(names)])
    ax.imshow(grid, cmap=colors, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
    for i in range(len(ranks)):
        for j in range(len(sizes)):
            ax.text(j, i, f"{speedup[i, j]:.1f}x", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(sizes)), [_size(s) for s in sizes])
    ax.set_yticks(range(len(ranks)), ranks)
    ax.set_xlabel("all_reduce size (bytes)")
    ax.set_ylabel(f"ranks ({machine.ranks_per_node} per node)")
    ax.set_title("Best all_reduce algorithm by the alpha-beta model (cells: ring time / best time)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors(i)) for i in range(len(names))]
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--calibrate", metavar="JSON", help="bench/run.py or bench/tune.py --json "
                   "output to fit the in-node alpha and beta from (ring all_reduce records)")
    p.add_argument("--calibrate-inter", metavar="JSON", help="bench/run.py --json output of a "
                   "run across hosts of --ranks-per-node ranks each, to fit the between-node "
                   "alpha and beta from (ringcomm's two-level all_reduce)")
    p.add_argument("--intra-alpha-us", type=float, default=DEFAULT_INTRA[0] * 1e6)
    p.add_argument("--intra-gbps", type=float, default=1 / DEFAULT_INTRA[1] / 1e9,
                   help="in-node bandwidth per rank, GB/s (1/beta)")
    p.add_argument("--inter-alpha-us", type=float, default=DEFAULT_INTER[0] * 1e6)
    p.add_argument("--inter-gbps", type=float, default=1 / DEFAULT_INTER[1] / 1e9,
                   help="between-node bandwidth per rank, GB/s (1/beta)")
    p.add_argument("--gamma-gbps", type=float, default=0.0,
                   help="reduction throughput, GB/s (0: folded into beta)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--json", metavar="PATH", help="write every prediction as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of the best algorithm per cell")
    args = p.parse_args(argv)

    gamma = 1 / (args.gamma_gbps * 1e9) if args.gamma_gbps > 0 else 0.0
    intra = Link(args.intra_alpha_us * 1e-6, 1 / (args.intra_gbps * 1e9), gamma)
    fits = {}
    if args.calibrate:
        records = load_records(args.calibrate)
        fits = {a: fit(records, a) for a in measured_algorithms(records)}
        if "ring" not in fits:
            raise SystemExit(f"{args.calibrate}: no ring all_reduce records to calibrate on")
        intra = replace(intra, alpha=fits["ring"][0], beta=fits["ring"][1])
    inter = Link(args.inter_alpha_us * 1e-6, 1 / (args.inter_gbps * 1e9), gamma)
    machine = Machine(intra, inter, args.ranks_per_node)
    if args.calibrate_inter:
        alpha, beta = fit_inter(load_records(args.calibrate_inter), machine)
        machine = replace(machine, inter=replace(inter, alpha=alpha, beta=beta))
        inter = machine.inter

    print(f"# in node: alpha {intra.alpha * 1e6:.2f} us, {1 / intra.beta / 1e9:.2f} GB/s"
          f"{' (fitted)' if args.calibrate else ''}; between nodes: alpha "
          f"{inter.alpha * 1e6:.2f} us, {1 / inter.beta / 1e9:.2f} GB/s"
          f"{' (fitted)' if args.calibrate_inter else ''}; "
          f"{machine.ranks_per_node} ranks per node")
    for name, (alpha, beta) in fits.items():
        if name != "ring":
            print(f"# measured {name}, fitted to its own formula: alpha {alpha * 1e6:.2f} us, "
                  f"{1 / beta / 1e9:.2f} GB/s (the table uses the ring's for every algorithm)")
    print(table(machine))
    if args.json:
        rows = [{"ranks": n, "size": s, **{k: v * 1e6 for k, v in predictions(n, s, machine).items()}}
                for n in RANKS for s in SIZES]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(args.plot, machine)


if __name__ == "__main__":
    main()
