"""The alpha-beta model of collectives between hosts, against measurement, and projected.

    python bench/between_hosts_model.py docs/between_hosts.json --plot docs/between_hosts_model.png

Records: bench/run.py --json across emulated hosts (tools/emulated_hosts.py ... --algorithm
ring,recursive_doubling), each with "hosts" (ranks per host L = nranks / hosts; 1 when absent)
and "cores" (the cores all ranks of all hosts share; --cores when absent). Per-call medians;
several records of one point (launches) are taken by their median.

A collective of S bytes (all_reduce's tensor, reduce_scatter's input, all_gather's output) on H
hosts takes R rounds (hops) and sends B S bytes out of each host (`shape`). With L > 1 ranks per
host, L lanes run the level between hosts on S/L each at once over the host's one link: the
host still sends B S, each lane takes R hops. With k ranks per core, the terms are

    latency    k (call + R hop_a + level)   host: every call and hop wakes threads that wait
                                            for a core; level: the level inside a host, L > 1
    link       B S beta                     network: the host's link
    ring CPU   k B S host_byte_ring         host: the ring's copies and reductions, pipelined
                                            with its link
    round CPU  k B S host_byte_recursive_doubling   host: recursive doubling receives a whole
                                            round before it reduces or sends on: in series

Emulated hosts share one machine's cores (k = H L / cores) and a link shaped by a token bucket
that refills while the ranks wait on their hops: a call costs the largest of latency, link and
ring CPU, plus round CPU. Real hosts (`Network`) have a core per rank (k = 1) and a wire whose
bytes follow each hop's latency: latency (plus the network's own alpha per hop) + the larger of
link and ring CPU + round CPU. The emulated hop is all CPU (the bridge adds nothing measurable):
its network alpha is inside hop_a. Fitted by least squares on relative error, each point in the
regime (which term is largest) the last solution puts it in, until that stops changing.

Prints each measured median beside the model's and the worst relative error; then, for 64, 256
and 1,024 hosts, per collective: the faster algorithm by size, auto's time (recursive doubling up
to logStepMaxBytes, as csrc/include/ringcomm/algorithms.h has it) against the flat ring's, and the
model's own crossover against logStepMaxBytes'."""
import argparse
import math
import os
import statistics
from dataclasses import dataclass

import numpy as np

import cost_model as cm

ALGORITHMS = ("ring", "recursive_doubling")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
PROJECTED_HOSTS = (64, 256, 1024)
PROJECTED_SIZES = [8 << (3 * i) for i in range(8)] + [64 << 20]  # 8 B ... 16 MiB, 64 MiB
PARAMETERS = ("call", "hop_ring", "hop_recursive_doubling", "level", "beta", "host_byte_ring",
              "host_byte_recursive_doubling")


@dataclass(frozen=True)
class Model:
    """Seconds: per call, per hop of each algorithm, per call of the level inside a host of
    several ranks (each per rank per core); per byte out of a host over the link; per byte out
    of a host per rank per core of the ring's and of recursive doubling's CPU work."""
    call: float
    hop_ring: float
    hop_recursive_doubling: float
    level: float
    beta: float
    host_byte_ring: float
    host_byte_recursive_doubling: float


@dataclass(frozen=True)
class Network:
    """Real hosts: a core per rank, `alpha` seconds per hop beyond the emulated hop, `beta`
    seconds per byte (None: the fitted link's)."""
    alpha: float = 0.0
    beta: float | None = None


def shape(collective, algorithm, hosts):
    """(rounds, bytes out of a host per byte of S) between `hosts` hosts. Recursive doubling
    on P, the largest power of two up to H, plus a fold in and out when H is not one (f = 1)."""
    h = hosts
    if algorithm == "ring":
        rounds = (2 if collective == "all_reduce" else 1) * (h - 1)
        return rounds, rounds / h
    p = 1 << int(math.log2(h))
    fold = 0 if p == h else 1
    rounds = int(math.log2(p)) + 2 * fold
    if collective == "all_reduce":
        return rounds, float(rounds)
    return rounds, (p - 1) / p + fold * (1 + 1 / h)


def features(collective, algorithm, hosts, size, ranks_per_core, per_host=1):
    """Rows of the least-squares system, each term its row . PARAMETERS: the candidates for the
    largest (latency, link, ring CPU) and what adds to it (round CPU)."""
    rounds, per_byte = shape(collective, algorithm, hosts)
    k, ring, sent = ranks_per_core, algorithm == "ring", per_byte * size
    return ([[k, k * rounds * ring, k * rounds * (not ring), k * (per_host > 1), 0, 0, 0],
             [0, 0, 0, 0, sent, 0, 0],
             [0, 0, 0, 0, 0, k * sent * ring, 0]],
            [0, 0, 0, 0, 0, 0, k * sent * (not ring)])


def _vector(model):
    return np.array([getattr(model, p) for p in PARAMETERS])


def predicted_us(model, collective, algorithm, hosts, size, ranks_per_core=1.0, per_host=1,
                 network=None):
    """Emulated hosts (network None) at `ranks_per_core`, or real hosts on a Network."""
    if network is not None:
        ranks_per_core = 1.0
        model = Model(model.call, model.hop_ring + network.alpha,
                      model.hop_recursive_doubling + network.alpha, model.level,
                      model.beta if network.beta is None else network.beta,
                      model.host_byte_ring, model.host_byte_recursive_doubling)
    candidates, added = features(collective, algorithm, hosts, size, ranks_per_core, per_host)
    latency, link, cpu = np.array(candidates) @ _vector(model)
    if network is None:
        return 1e6 * float(max(latency, link, cpu) + np.dot(added, _vector(model)))
    return 1e6 * float(latency + max(link, cpu) + np.dot(added, _vector(model)))


def log_step_max_bytes(collective, hosts):
    """logStepMaxBytes of csrc/include/ringcomm/algorithms.h, its constants included."""
    ring_alpha, log_alpha, beta, cap = 45.7e-6, 30.4e-6, 1 / 475e6, 256 << 10
    return crossover(collective, hosts, cm.Link(ring_alpha, beta), cm.Link(log_alpha, beta), cap)


def crossover(collective, hosts, ring, log_step, cap=None):
    """The largest size at which recursive doubling is no slower than the ring (0: never),
    each a Link of per-hop alpha and per-byte beta; `cap` bounds it (None: unbounded)."""
    if hosts < 2:
        return 0
    ring_rounds, ring_bytes = shape(collective, "ring", hosts)
    log_rounds, log_bytes = shape(collective, "recursive_doubling", hosts)
    ring_fixed, log_fixed = ring_rounds * ring.alpha, log_rounds * log_step.alpha
    ring_per_byte, log_per_byte = ring_bytes * ring.beta, log_bytes * log_step.beta
    unbounded = math.inf if cap is None else cap
    if log_fixed >= ring_fixed:
        return 0
    if log_per_byte <= ring_per_byte:
        return unbounded
    return min(unbounded, int((ring_fixed - log_fixed) / (log_per_byte - ring_per_byte)))


def model_crossover(model, collective, hosts, network=Network()):
    """The model's own crossover on a Network (uncapped; the call cost is common to both)."""
    beta = model.beta if network.beta is None else network.beta
    return crossover(collective, hosts,
                     cm.Link(model.hop_ring + network.alpha, max(beta, model.host_byte_ring)),
                     cm.Link(model.hop_recursive_doubling + network.alpha,
                             beta + model.host_byte_recursive_doubling))


# -- records ------------------------------------------------------------------------------

def load(paths, cores):
    """The files' records of the two algorithms, one per point (the median of its launches):
    collective, algorithm, hosts, per_host, ranks_per_core, size, inplace, time_us (per-call
    median), launches (each launch's)."""
    points = {}
    for path in paths:
        for r in cm.load_records(path):
            algorithm = cm._algorithm(r.get("impl", ""))
            if r.get("collective") in COLLECTIVES and algorithm in ALGORITHMS and r.get("p50_us"):
                hosts = r.get("hosts", r["nranks"])
                key = (r["collective"], algorithm, hosts, r["nranks"] // hosts,
                       r["nranks"] / r.get("cores", cores), r["size"], r.get("inplace", True))
                points.setdefault(key, []).append(r["p50_us"])
    names = ("collective", "algorithm", "hosts", "per_host", "ranks_per_core", "size", "inplace")
    return [dict(zip(names, key), time_us=statistics.median(times), launches=times)
            for key, times in points.items()]


def _rows(r):
    return features(r["collective"], r["algorithm"], r["hosts"], r["size"], r["ranks_per_core"],
                    r["per_host"])


def _solve(chosen, added, t):
    solution, *_ = np.linalg.lstsq((chosen + added) / t[:, None], np.ones(len(t)), rcond=None)
    return solution


def _refine(start, candidates, added, t, rounds=50):
    """Each record in the regime (its largest term) `start` puts it in, solved, until the
    regimes stop changing. Returns (solution, squared relative error)."""
    solution, largest = start, None
    for _ in range(rounds):
        now = (candidates @ solution).argmax(axis=1)
        if largest is not None and (now == largest).all():
            break
        largest = now
        solution = _solve(candidates[np.arange(len(t)), largest], added, t)
    model = (candidates @ solution).max(axis=1) + added @ solution
    return solution, float(np.sum((model / t - 1) ** 2))


def fit(records):
    """The Model minimising the squared relative error over `records` (emulated hosts). The
    regimes are a local search: a term that a start never makes the largest gets no rows and
    stays at zero, so it starts from the fit of the sum of all terms and from that with each
    parameter in turn ten times larger, and keeps the best. Raises if a parameter comes out
    negative (the records do not determine it)."""
    t = np.array([r["time_us"] * 1e-6 for r in records])
    candidates, added = (np.array(m, dtype=float) for m in zip(*map(_rows, records)))
    first = _solve(candidates.sum(axis=1), added, t)
    starts = [first] + [first * np.where(np.arange(len(first)) == i, 10.0, 1.0)
                        for i in range(len(first))]
    solution, _ = min((_refine(s, candidates, added, t) for s in starts), key=lambda r: r[1])
    model = Model(*map(float, solution))
    negative = [p for p in PARAMETERS if getattr(model, p) < 0]
    if negative:
        raise ValueError(f"fit gave negative {', '.join(negative)}: {model}")
    return model


def errors(records, model):
    """Each record with "model_us" and "error" (relative, signed) added, in a stable order."""
    rows = [dict(r, model_us=(m := predicted_us(model, r["collective"], r["algorithm"],
                                                r["hosts"], r["size"], r["ranks_per_core"],
                                                r["per_host"])),
                 error=(m - r["time_us"]) / r["time_us"]) for r in records]
    return sorted(rows, key=lambda r: (r["hosts"], r["per_host"], r["collective"],
                                       r["algorithm"], r["size"], r["inplace"]))


def projection(model, network=Network(), hosts=PROJECTED_HOSTS, sizes=PROJECTED_SIZES):
    """[(collective, hosts, size, faster, ring us, recursive doubling us, auto us)] on
    `network`; auto runs recursive doubling up to log_step_max_bytes."""
    rows = []
    for c in COLLECTIVES:
        for h in hosts:
            for s in sizes:
                t = {a: predicted_us(model, c, a, h, s, network=network) for a in ALGORITHMS}
                auto = t["recursive_doubling" if s <= log_step_max_bytes(c, h) else "ring"]
                rows.append((c, h, s, min(t, key=t.get), t["ring"], t["recursive_doubling"],
                             auto))
    return rows


# -- output -------------------------------------------------------------------------------

def _size(nbytes):
    return cm._size(nbytes) if nbytes < math.inf else "any"


def _bytes(nbytes):
    return f"{nbytes:,}" if nbytes < math.inf else "any"


def print_report(records, model, network=Network()):
    print(f"# fitted: call {model.call * 1e6:.1f} us, hop: ring {model.hop_ring * 1e6:.1f}, "
          f"recursive doubling {model.hop_recursive_doubling * 1e6:.1f} us, each per rank per "
          f"core; level {model.level * 1e6:.0f} us per rank per core; link "
          f"{1e-6 / model.beta:.0f} MB/s; CPU per byte sent, per rank per core: ring "
          f"{model.host_byte_ring * 1e9:.2f} ns, recursive doubling "
          f"{model.host_byte_recursive_doubling * 1e9:.2f} ns")
    rows = errors(records, model)
    print("| hosts x ranks | collective | algorithm | size | in place | measured p50 (us) "
          "| model (us) | error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['hosts']}x{r['per_host']} | {r['collective']} | {r['algorithm']} "
              f"| {_size(r['size'])} | {'yes' if r['inplace'] else 'no'} | {r['time_us']:.0f} "
              f"| {r['model_us']:.0f} | {r['error']:+.0%} |")
    for layout in sorted({(r["hosts"], r["per_host"]) for r in rows}):
        mine = [r for r in rows if (r["hosts"], r["per_host"]) == layout]
        w = max(mine, key=lambda r: abs(r["error"]))
        print(f"# worst at {layout[0]}x{layout[1]}: {w['collective']} {w['algorithm']} "
              f"{_size(w['size'])}: {w['error']:+.0%}")
    w = max(rows, key=lambda r: abs(r["error"]))
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    print(f"# worst: {w['hosts']}x{w['per_host']} {w['collective']} {w['algorithm']} "
          f"{_size(w['size'])}: {w['error']:+.0%}; {within} of {len(rows)} within 25%")
    beta = model.beta if network.beta is None else network.beta
    print(f"# projected: one rank per core, {network.alpha * 1e6:g} us per hop more, "
          f"{1e-6 / beta:.0f} MB/s")
    print("| collective | hosts | size | faster | ring (us) | recursive doubling (us) | auto (us) "
          "| auto / ring | auto / faster |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, h, s, faster, ring, log_step, auto in projection(model, network):
        print(f"| {c} | {h} | {_size(s)} | {faster} | {ring:.0f} | {log_step:.0f} | {auto:.0f} "
              f"| {auto / ring:.2f} | {auto / min(ring, log_step):.2f} |")
    print("| collective | hosts | model's crossover (B) | logStepMaxBytes (B) |")
    print("|---|---|---|---|")
    for c in COLLECTIVES:
        for h in (2, 3, 4, 8) + PROJECTED_HOSTS:
            print(f"| {c} | {h} | {_bytes(model_crossover(model, c, h, network))} "
                  f"| {_bytes(log_step_max_bytes(c, h))} |")


def plot(path, records, model, network=Network()):
    """Top: each emulated layout's model (lines) and measured medians (ring o, recursive
    doubling x); bottom: projected on `network`, auto's switch dotted. One colour per layout
    or host count."""
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    sizes = [8 << i for i in range(24)]
    layouts = sorted({(r["hosts"], r["per_host"], r["ranks_per_core"]) for r in records})
    styles = {"ring": ("-", "o"), "recursive_doubling": ("--", "x")}
    for top, bottom, c in zip(axes[0], axes[1], COLLECTIVES):
        for colour, (h, l, k) in enumerate(layouts):
            for a, (line, marker) in styles.items():
                top.plot(sizes, [predicted_us(model, c, a, h, s, k, l) for s in sizes], line,
                         color=f"C{colour}", linewidth=1, label=f"{a}, {h}x{l}")
                dots = [r for r in records if (r["hosts"], r["per_host"]) == (h, l)
                        and r["collective"] == c and r["algorithm"] == a]
                top.plot([r["size"] for r in dots], [r["time_us"] for r in dots], marker,
                         color=f"C{colour}", markersize=4)
        top.set_title(f"{c}, emulated hosts x ranks")
        for colour, h in enumerate(PROJECTED_HOSTS):
            for a, (line, _) in styles.items():
                bottom.plot(sizes, [predicted_us(model, c, a, h, s, network=network)
                                    for s in sizes], line, color=f"C{colour}",
                            label=f"{a}, {h} hosts")
        for switch in sorted({log_step_max_bytes(c, h) for h in PROJECTED_HOSTS}):
            bottom.axvline(switch, color="grey", linestyle=":", label="logStepMaxBytes")
        bottom.set_title(f"{c}, projected: a core per rank")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2), ax.set_yscale("log")
            ax.set_xlabel("size (bytes)"), ax.set_ylabel("per-call time (us)")
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", help="bench/run.py --json files across emulated hosts")
    p.add_argument("--cores", type=int, default=os.cpu_count(),
                   help="cores the emulated hosts shared, for records without 'cores'")
    p.add_argument("--fit-max-bytes", type=int, help="fit on sizes up to this only; every "
                   "record is still compared")
    p.add_argument("--plot", metavar="PNG", help="measured and modelled times, and projected")
    p.add_argument("--alpha-us", type=float, default=0.0,
                   help="projected network's latency per hop beyond the emulated hop's")
    p.add_argument("--gbps", type=float, help="projected network's rate (default: the fitted)")
    args = p.parse_args(argv)
    network = Network(args.alpha_us * 1e-6, args.gbps and 8 / (args.gbps * 1e9))
    records = load(args.json, args.cores)
    model = fit([r for r in records if not args.fit_max_bytes or r["size"] <= args.fit_max_bytes])
    print_report(records, model, network)
    if args.plot:
        plot(args.plot, records, model, network)


if __name__ == "__main__":
    main()
