"""The alpha-beta model of all_reduce between hosts, against measurement, and projected.

    python bench/between_hosts_model.py h2.json h3.json h4.json h8.json --plot between_hosts.png

Each file: bench/run.py --json records across emulated hosts of one rank each
(tools/emulated_hosts.py --nproc-per-node 1 ... --algorithm ring,recursive_doubling). Each
algorithm's alpha and beta are fitted to its own formula (bench/cost_model.py: ring 2(H-1) alpha
+ 2(H-1)/H S beta; recursive doubling log2(P) (alpha + S beta), plus the fold and unfold) on the
per-call medians of every host count together (or of --fit-hosts'). Prints each measured median beside the model's
and the worst relative error, then, for 64, 256 and 1,024 hosts, which of the two is faster at
each size, the time of what auto runs (recursive doubling up to `auto_max_bytes`) and of the flat
ring. The plot draws both models against size per host count, the measured medians on them."""
import argparse
import json

import cost_model as cm

ALGORITHMS = ("ring", "recursive_doubling")
PROJECTED_HOSTS = (64, 256, 1024)
PROJECTED_SIZES = [8 << (3 * i) for i in range(8)]  # 8 B ... 16 MiB
# One threshold for every host count, as docs/between_hosts_model.txt was made with (auto now
# takes logStepMaxBytes in csrc/include/ringcomm/algorithms.h, by host count).
RD_MAX_BYTES = 16 * 1024


def medians(paths):
    """The files' all_reduce records of the two algorithms, timed by their per-call median."""
    return medians_of([r for path in paths for r in cm.load_records(path)])


def medians_of(records):
    chosen = []
    for r in records:
        name = cm._algorithm(r.get("impl", ""))
        if r.get("collective") == "all_reduce" and name in ALGORITHMS and r.get("p50_us"):
            chosen.append(dict(r, impl=f"ringcomm-{name}", time_us=r["p50_us"]))
    return chosen


def fit_links(records):
    """{algorithm: Link} fitted to each algorithm's own formula."""
    return {a: cm.Link(*cm.fit(records, a)) for a in ALGORITHMS}


def predicted_us(algorithm, hosts, size, links):
    return cm.FORMULAS[algorithm](hosts, size, links[algorithm]) * 1e6


def errors(records, links):
    """[(algorithm, hosts, size, measured us, predicted us, relative error)]."""
    rows = []
    for r in records:
        algorithm = cm._algorithm(r["impl"])
        model = predicted_us(algorithm, r["nranks"], r["size"], links)
        rows.append((algorithm, r["nranks"], r["size"], r["time_us"], model,
                     (model - r["time_us"]) / r["time_us"]))
    return sorted(rows, key=lambda row: row[:3])


def projection(links, hosts=PROJECTED_HOSTS, sizes=PROJECTED_SIZES, auto_max_bytes=RD_MAX_BYTES):
    """[(hosts, size, faster algorithm, auto's time, flat ring's time)] in us."""
    rows = []
    for h in hosts:
        for s in sizes:
            times = {a: predicted_us(a, h, s, links) for a in ALGORITHMS}
            auto = times["recursive_doubling" if s <= auto_max_bytes else "ring"]
            rows.append((h, s, min(times, key=times.get), auto, times["ring"]))
    return rows


def plot(path, records, links, hosts):
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = [8 << i for i in range(25)]
    for h in hosts:
        for a, style in zip(ALGORITHMS, ("-", "--")):
            line, = ax.plot(sizes, [predicted_us(a, h, s, links) for s in sizes], style,
                            label=f"{a}, {h} hosts")
            measured = [r for r in records if r["nranks"] == h and cm._algorithm(r["impl"]) == a]
            ax.plot([r["size"] for r in measured], [r["time_us"] for r in measured], "o",
                    color=line.get_color(), markersize=3)
    ax.set_xscale("log", base=2), ax.set_yscale("log")
    ax.set_xlabel("all_reduce size (bytes)"), ax.set_ylabel("time (us)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("all_reduce between hosts: model (lines) and measured medians (dots)")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", help="bench/run.py --json files across hosts")
    p.add_argument("--plot", metavar="PNG", help="the models against size, measured dots on them")
    p.add_argument("--fit-hosts", type=lambda t: {int(h) for h in t.split(",")},
                   help="fit on these host counts only (e.g. 2,3: where ranks are not crowded "
                        "onto fewer cores); every record is still compared")
    args = p.parse_args(argv)
    records = medians(args.json)
    links = fit_links([r for r in records if not args.fit_hosts or r["nranks"] in args.fit_hosts])
    for a, link in links.items():
        print(f"# {a}: alpha {link.alpha * 1e6:.1f} us, {1 / link.beta / 1e6:.0f} MB/s (fitted)")
    rows = errors(records, links)
    print("| algorithm | hosts | size (B) | measured p50 (us) | model (us) | error |")
    print("|---|---|---|---|---|---|")
    for a, h, s, measured, model, err in rows:
        print(f"| {a} | {h} | {s} | {measured:.0f} | {model:.0f} | {err:+.0%} |")
    for h in sorted({row[1] for row in rows}):
        worst = max((row for row in rows if row[1] == h), key=lambda row: abs(row[5]))
        print(f"# worst at {h} hosts: {worst[0]}, {worst[2]} B: {worst[5]:+.0%}")
    print("| hosts | size (B) | faster | auto (us) | flat ring (us) | auto / ring |")
    print("|---|---|---|---|---|---|")
    for h, s, faster, auto, ring in projection(links):
        print(f"| {h} | {s} | {faster} | {auto:.0f} | {ring:.0f} | {auto / ring:.2f} |")
    if args.plot:
        plot(args.plot, records, links, sorted({r["nranks"] for r in records}) + [64, 1024])


if __name__ == "__main__":
    main()
