"""Which ringcomm algorithm where, measured: every algorithm ringcomm offers, beside gloo, in one
launch per world size; the selector's thresholds from the crossovers, and the latency and
bandwidth targets.

    python bench/tune.py                              # 2 ranks, all_reduce 8 B .. 64 MiB, x2 steps
    python bench/tune.py --nproc 4 --json t4.json --plot t4.png
    python bench/tune.py --nproc 2 --load 2           # the same beside 2 busy-looping processes
    python bench/tune.py -b 8 -e 1M -f 4 --rounds 9   # any bench/run.py option

A bench/run.py run with these defaults: every name in ringcomm.options.ALGORITHMS (--algorithm
all), for all_reduce and for each collective whose Communicator call takes algorithm= (detected),
-f 2, -n 20 -w 3, 6 rounds per size with the implementations alternating within each (each
following every other in turn; the reported time is the median round's, the spread the rounds'
interquartile range). Then, on rank 0:

- per collective, a table of median times and spreads, each algorithm's time over the ring's and
  over gloo's, and the fastest algorithm per size;
- suggested thresholds: for the one-hop algorithms, in ALGORITHMS' order, the largest size each
  should take (below the next one's range; the ring above all), chosen to lose the least against
  the fastest at every measured size; printed as RINGCOMM_<NAME>_MAX_BYTES=... lines for
  all_reduce, as comments for the other collectives;
- the selector check: sizes where "auto" is slower than the ring by more than the noise (the
  larger of the two spreads);
- the targets: 8 B all_reduce time and its ratio to gloo, 64 MiB busbw over gloo's.

--json writes {"records", "analysis", "environment"}; --plot draws time and time over the ring
against size. One launch on a busy machine is noisy: repeat it, then pool the launches

    python bench/tune.py --merge t2a.json t2b.json t2c.json --json t2.json --plot t2.png

(each size's rounds from every launch together: median and spread over all of them).
"""
import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import subprocess
import sys

import harness
import run  # bench/run.py: the launcher (it finds ringcomm in a source checkout too)
from collectives import COLLECTIVES

import ringcomm  # noqa: E402 (after run, which puts a checkout's ringcomm on the path)
from ringcomm.options import (COLLECTIVES_WITH_ALGORITHM, ALGORITHMS, THRESHOLDS,  # noqa: E402
                              CommOptions)

SELECTOR, REFERENCE, BASELINE = "auto", "ring", "gloo"
DEFAULTS = ["-b", "8", "-e", "64M", "-f", "2", "-n", "20", "-w", "3", "--rounds", "6",
            "--algorithm", "all"]


@dataclasses.dataclass(frozen=True)
class Target:
    small_us: float  # 8 B all_reduce, at most
    small_vs_gloo: float  # 8 B all_reduce time over gloo's, at most


# Targets: 8 B within 1.5x of OpenMPI's shared-memory allreduce; 64 MiB busbw >= 3x gloo's.
TARGETS = {2: Target(6.0, 0.01), 4: Target(20.0, 0.015)}
SMALL, LARGE, LARGE_VS_GLOO = 8, 64 << 20, 3.0


# -- analysis (pure functions of the records) -----------------------------------------------

def short(impl):
    """'ringcomm-one_shot' -> 'one_shot'; other names unchanged."""
    return impl.removeprefix("ringcomm-")


def one_hop(names):
    """The algorithms a threshold chooses, in the measured order (the measuring build's
    ALGORITHMS): every ringcomm algorithm but the ring and the selector."""
    return [n for n in names if n not in (REFERENCE, SELECTOR, BASELINE, "ringcomm")]


def select(size, thresholds, fallback=REFERENCE, collective="all_reduce", world=4):
    """The algorithm `auto` runs at `size` with these thresholds ({algorithm: max_bytes}): the
    communicator's own rule (_C.choose_algorithm), its 2-rank rule included. all_reduce's
    thresholds are its algorithms' <name>_max_bytes; reduce_scatter and all_gather run one_shot
    up to two_shot_max_bytes (one_shot is their two_shot half). An algorithm not measured is
    never chosen (0), and one chosen but not measured reads as the fallback."""
    limits = dict.fromkeys(THRESHOLDS, 0)
    if collective == "all_reduce":
        limits.update({f"{name}_max_bytes": max_bytes for name, max_bytes in thresholds.items()
                       if f"{name}_max_bytes" in limits})
    else:
        limits["two_shot_max_bytes"] = thresholds.get("one_shot", 0)
    chosen = ringcomm._C.choose_algorithm(ringcomm._C.Collective.__members__[collective], size,
                                          world, limits).name
    return chosen if chosen in thresholds else fallback


def suggest_thresholds(times, candidates, fallback=REFERENCE, collective="all_reduce", world=4):
    """{candidate: max_bytes} (0: never) minimising the summed log of (time picked / fastest time)
    over the measured sizes; `times` is {algorithm: {size: seconds}}, the candidates are tried
    in order below the fallback. Ties go to the smaller thresholds (the ring, the default)."""
    candidates = [c for c in candidates if c in times]
    names = candidates + [fallback]
    sizes = sorted(set.intersection(*(set(times[n]) for n in names)))
    if not sizes:
        return {c: 0 for c in candidates}
    fastest = {s: min(times[n][s] for n in names) for s in sizes}
    best = None
    for choice in itertools.product([0] + sizes, repeat=len(candidates)):
        thresholds = dict(zip(candidates, choice))
        loss = sum(math.log(times[select(s, thresholds, fallback, collective, world)][s] /
                            fastest[s]) for s in sizes)
        key = (round(loss, 9), choice)
        if best is None or key < best[0]:
            best = (key, thresholds)
    thresholds = best[1]
    used = {select(s, thresholds, fallback, collective, world) for s in sizes}
    return {c: (t if c in used else 0) for c, t in thresholds.items()}


def threshold_setting(name):
    """(environment variable, whether CommOptions has the field) for an algorithm's threshold."""
    field = f"{name}_max_bytes"
    present = field in {f.name for f in dataclasses.fields(CommOptions)}
    return f"RINGCOMM_{field.upper()}", present


def _variant(records):
    """The records analysed: out-of-place where measured (the common call), else in-place."""
    inplace = all(r["inplace"] for r in records)
    return [r for r in records if r["inplace"] == inplace], inplace


def analyse_collective(records, world=4):
    """Rows per size (median, spread, ratios, fastest), thresholds and the selector check for
    one collective's records."""
    records, inplace = _variant(records)
    by = {(short(r["impl"]), r["size"]): r for r in records}
    names = list(dict.fromkeys(short(r["impl"]) for r in records))
    rows = []
    for size in sorted({r["size"] for r in records}):
        here = {n: by[n, size] for n in names if (n, size) in by}
        t = {n: r["time_us"] for n, r in here.items()}
        row = {"size": size, "time_us": t,
               "spread_us": {n: r["spread_us"] for n, r in here.items()},
               "busbw": {n: r["busbw"] for n, r in here.items()},
               "wrong": sum(r["wrong"] or 0 for r in here.values())}
        for ref in (REFERENCE, BASELINE):
            if ref in t:
                row[f"vs_{ref}"] = {n: v / t[ref] for n, v in t.items()}
        contenders = {n: v for n, v in t.items() if n != SELECTOR}
        row["fastest"] = min(contenders, key=contenders.get)
        rows.append(row)
    times = {n: {row["size"]: row["time_us"][n] for row in rows if n in row["time_us"]}
             for n in names}
    candidates = one_hop(names)
    collective = records[0]["collective"] if records else "all_reduce"
    thresholds = suggest_thresholds(times, candidates, REFERENCE, collective, world) \
        if REFERENCE in names else {}
    return {"inplace": inplace, "algorithms": names, "rows": rows, "thresholds": thresholds,
            "selector_violations": selector_violations(rows)}


def selector_violations(rows, selector=SELECTOR, reference=REFERENCE):
    """Sizes where the selector's median is slower than the reference's by more than the noise
    (the larger of their spreads)."""
    out = []
    for row in rows:
        t, spread = row["time_us"], row["spread_us"]
        if selector in t and reference in t:
            noise = max(spread[selector], spread[reference])
            if t[selector] - t[reference] > noise:
                out.append({"size": row["size"], "selector_us": t[selector],
                            "reference_us": t[reference], "noise_us": noise,
                            "ratio": t[selector] / t[reference]})
    return out


def targets(rows, world):
    """The targets from all_reduce rows: the best algorithm and the selector at 8 B (time,
    time over gloo's) and at 64 MiB (busbw over gloo's); None where a size was not measured."""
    by = {row["size"]: row for row in rows}
    goal = TARGETS.get(world)
    out = {"world": world}
    for size, key in ((SMALL, "small"), (LARGE, "large")):
        row = by.get(size)
        if row is None or BASELINE not in row["time_us"]:
            out[key] = None
            continue
        t = row["time_us"]
        mine = {n: v for n, v in t.items() if n != BASELINE}
        best = min((n for n in mine if n != SELECTOR), key=mine.get, default=None)
        entry = {"size": size, "gloo_us": t[BASELINE], "best": best}
        for label, name in (("best", best), ("selector", SELECTOR if SELECTOR in mine else None)):
            if name is None:
                continue
            entry[f"{label}_us"] = t[name]
            entry[f"{label}_vs_gloo"] = t[name] / t[BASELINE]  # time ratio (= busbw inverse)
            if key == "small" and goal:
                entry[f"{label}_met"] = t[name] <= goal.small_us and \
                    t[name] / t[BASELINE] <= goal.small_vs_gloo
            elif key == "large":
                entry[f"{label}_met"] = t[BASELINE] / t[name] >= LARGE_VS_GLOO
        out[key] = entry
    return out


def analyse(records, world):
    """{collective: analysis}, with the targets under all_reduce."""
    out = {}
    for coll in dict.fromkeys(r["collective"] for r in records):
        out[coll] = analyse_collective([r for r in records if r["collective"] == coll], world)
        if coll == "all_reduce":
            out[coll]["targets"] = targets(out[coll]["rows"], world)
    return out


# -- the report -------------------------------------------------------------------------------

def _us(v):
    return f"{v:.2f}" if v < 100 else f"{v:.1f}" if v < 1e4 else f"{v:.0f}"


def summary_table(coll, result, world, rounds):
    names = result["algorithms"]
    ratios = [(ref, n) for ref in (REFERENCE, BASELINE) for n in names
              if ref in names and n not in (ref, BASELINE)]
    variant = "in place" if result["inplace"] else "out of place"
    lines = [f"# {coll}, {world} ranks, {variant}: median time (us) and [spread] over {rounds} "
             "rounds; time ratios; fastest (the selector aside)",
             f"# {'size':>10}" + "".join(f" {n:>18}" for n in names)
             + "".join(f" {f'{n}/{ref}':>14}" for ref, n in ratios) + "  fastest"]
    for row in result["rows"]:
        line = f"  {harness.format_size(row['size']):>10}"
        for n in names:
            t = row["time_us"].get(n)
            line += f" {'N/A':>18}" if t is None else \
                f" {_us(t):>10} [{_us(row['spread_us'][n]):>5}]"
        for ref, n in ratios:
            v = row.get(f"vs_{ref}", {}).get(n)
            line += f" {'N/A':>14}" if v is None else f" {v:>14.3f}"
        wrong = f"  #wrong {row['wrong']}" if row["wrong"] else ""
        lines.append(line + f"  {row['fastest']}" + wrong)
    return "\n".join(lines)


def threshold_lines(coll, result, world):
    """RINGCOMM_<NAME>_MAX_BYTES=... for all_reduce (the fields are named after its algorithms);
    comments for the other collectives, whose mapping onto the fields is the selector's."""
    lines = []
    for name, max_bytes in result["thresholds"].items():
        where = f"up to {harness.format_size(max_bytes)}" if max_bytes else "never"
        if coll != "all_reduce":
            lines.append(f"# suggested for {coll}, {world} ranks: {name} {where} ({max_bytes})")
            continue
        env, present = threshold_setting(name)
        note = "" if present else f"  # no CommOptions.{name}_max_bytes in this build"
        lines.append(f"{env}={max_bytes}  # {coll}, {world} ranks: {name} {where}{note}")
    if not result["thresholds"]:
        lines.append(f"# {coll}: no one-hop algorithm measured beside the ring: no thresholds")
    return lines


def violation_lines(coll, result):
    bad = result["selector_violations"]
    if SELECTOR not in result["algorithms"] or REFERENCE not in result["algorithms"]:
        return []
    head = f"# selector check, {coll}: {SELECTOR} slower than {REFERENCE} by more than the noise " \
           f"at {len(bad)} size(s)"
    return [head] + [f"#   {harness.format_size(v['size'])}: {_us(v['selector_us'])} us vs "
                     f"{_us(v['reference_us'])} us ({v['ratio']:.2f}x; "
                     f"noise {_us(v['noise_us'])} us)" for v in bad]


def _met(entry, label):
    return "met" if entry.get(f"{label}_met") else "NOT met"


def _contenders(entry):
    """(label, name) of the best algorithm and of the selector, where measured."""
    return [(label, entry["best"] if label == "best" else SELECTOR)
            for label in ("best", "selector") if f"{label}_us" in entry]


def target_lines(result, world):
    t, goal = result["targets"], TARGETS.get(world)
    lines = []
    small, large = t["small"], t["large"]
    if small is None:
        lines.append("# target, 8 B all_reduce: not measured (needs -b 8 and the gloo baseline)")
    else:
        parts = [f"{name} {_us(small[f'{label}_us'])} us = {small[f'{label}_vs_gloo']:.4f}x gloo"
                 + (f" ({_met(small, label)})" if goal else "")
                 for label, name in _contenders(small)]
        goal_text = f"  [target <= {goal.small_us:g} us and <= {goal.small_vs_gloo:g}x gloo]" \
            if goal else ""
        lines.append(f"# target, 8 B all_reduce, {world} ranks: gloo {_us(small['gloo_us'])} us; "
                     + "; ".join(parts) + goal_text)
    if large is None:
        lines.append("# target, 64 MiB all_reduce busbw: not measured (needs -e 64M and gloo)")
    else:
        parts = [f"{name} {1 / large[f'{label}_vs_gloo']:.2f}x gloo ({_met(large, label)})"
                 for label, name in _contenders(large)]
        lines.append(f"# target, 64 MiB all_reduce busbw, {world} ranks: " + "; ".join(parts)
                     + f"  [target >= {LARGE_VS_GLOO:g}x]")
    return lines


def environment(args, world):
    load = harness.machine_load(getattr(args, "cpu_before", {}), harness.cpu_times())
    return {"nranks": world, "cores": os.cpu_count(), "loadavg_before": list(args.loadavg),
            "busy_processes": args.load, "rounds": args.rounds, "iters": args.iters,
            "warmup": args.warmup_iters, "algorithms": list(ALGORITHMS),
            "ringcomm": ringcomm.__file__, "ringcomm_commit": _commit(ringcomm.__file__),
            "command": sys.argv, **load}


def _commit(path):
    """The git commit of the checkout `path` lies in (None for an installed package)."""
    try:
        out = subprocess.run(["git", "-C", os.path.dirname(path), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment_line(env):
    """One line per launch: cores, load before, busy processes beside, busy and stolen shares."""
    lines = []
    for one in env.get("launches", [env]):
        text = f"# machine: {one['cores']} cores; load average before the run " \
               f"{one['loadavg_before'][0]:.2f} (1 min); {one['busy_processes']} busy processes " \
               "beside"
        if "busy_pct" in one:
            text += f"; during the run {one['busy_pct']:.0f} % busy, {one['steal_pct']:.0f} % " \
                    "stolen"
        lines.append(text)
    return "\n".join(lines)


def publish(records, world, env, json_path=None, plot_path=None):
    """Print the analysis of `records`; write the JSON and the plot where asked."""
    analysis = analyse(records, world)
    rounds = len(records[0]["rounds_us"]) if records else 0
    lines = [environment_line(env)]
    for coll, result in analysis.items():
        lines += ["", summary_table(coll, result, world, rounds)]
        lines += threshold_lines(coll, result, world) + violation_lines(coll, result)
        if "targets" in result:
            lines += target_lines(result, world)
    print("\n".join(lines), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"records": records, "analysis": analysis, "environment": env}, f, indent=1)
    if plot_path:
        busy = sorted({one["busy_processes"] for one in env.get("launches", [env])})
        plot(plot_path, records, f"{world} ranks, {env.get('cores')} cores, "
                                 f"{'/'.join(map(str, busy))} busy processes beside")


def report(records, world, args):
    """bench/run.py's rank 0 at the end: the analysis, the JSON and the plot."""
    publish(records, world, environment(args, world), args.json, args.plot)


def merge(launches):
    """Several launches' records as one: each (collective, implementation, size, variant) gets
    every launch's rounds, their median and spread. All launches must have the same world."""
    pooled = {}
    for records in launches:
        for r in records:
            key = (r["collective"], r["impl"], r["size"], r["inplace"])
            if key in pooled:
                pooled[key]["rounds_us"] = pooled[key]["rounds_us"] + r["rounds_us"]
                pooled[key]["wrong"] = (pooled[key]["wrong"] or 0) + (r["wrong"] or 0)
            else:
                pooled[key] = dict(r)
    for r in pooled.values():
        seconds = [t * 1e-6 for t in r["rounds_us"]]
        factor = r["busbw"] / r["algbw"] if r["algbw"] else 1.0
        r["time_us"] = statistics.median(seconds) * 1e6
        r["spread_us"] = harness.spread(seconds) * 1e6
        r["algbw"] = r["size"] / r["time_us"] / 1e3  # GB/s
        r["busbw"] = r["algbw"] * factor
    return list(pooled.values())


def main_merge(argv):
    p = argparse.ArgumentParser(prog="tune.py --merge",
                                description="Pool several bench/tune.py --json launches of one "
                                            "world size and analyse them as one.")
    p.add_argument("--merge", nargs="+", required=True, metavar="JSON")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PATH")
    args = p.parse_args(argv)
    launches = []
    for path in args.merge:
        with open(path) as f:
            launches.append(json.load(f))
    worlds = {d["environment"]["nranks"] for d in launches}
    if len(worlds) != 1:
        p.error(f"launches of different world sizes {sorted(worlds)}: merge one at a time")
    env = {"launches": [d["environment"] for d in launches], "nranks": worlds.pop(),
           "cores": launches[0]["environment"]["cores"], "sources": args.merge}
    publish(merge([d["records"] for d in launches]), env["nranks"], env, args.json, args.plot)


def plot(path, records, title):
    """Per collective: median time against size (band: the rounds' range), and each algorithm's
    time over the ring's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colls = list(dict.fromkeys(r["collective"] for r in records))
    fig, axes = plt.subplots(2, len(colls), figsize=(6.5 * len(colls), 8), squeeze=False,
                             sharex="col")
    for col, coll in enumerate(colls):
        mine, _ = _variant([r for r in records if r["collective"] == coll])
        ring = {r["size"]: r["time_us"] for r in mine if short(r["impl"]) == REFERENCE}
        for color, impl in enumerate(dict.fromkeys(r["impl"] for r in mine)):
            pts = sorted((r["size"], r["time_us"], min(r["rounds_us"]), max(r["rounds_us"]))
                         for r in mine if r["impl"] == impl)
            sizes, med, low, high = zip(*pts)
            axes[0, col].plot(sizes, med, marker="o", ms=3, color=f"C{color}", label=short(impl))
            axes[0, col].fill_between(sizes, low, high, color=f"C{color}", alpha=0.15)
            if ring and short(impl) != BASELINE:  # gloo's ratio is in the table: keep the scale
                ratio = [(s, t / ring[s]) for s, t, _, _ in pts if s in ring]
                axes[1, col].plot(*zip(*ratio), marker="o", ms=3, color=f"C{color}",
                                  label=short(impl))
        axes[0, col].set(title=coll, ylabel="time (us), median; band: rounds' range",
                         xscale="log", yscale="log")
        axes[1, col].set(xlabel="size (bytes)", ylabel=f"time / {REFERENCE}'s", xscale="log",
                         yscale="log")
        axes[1, col].axhline(1.0, color="gray", lw=0.8)
        for which in ("major", "minor"):  # 0.5, 2, not 5x10^-1, 2x10^0
            getattr(axes[1, col].yaxis, f"set_{which}_formatter")(
                FuncFormatter(lambda y, _: f"{y:g}"))
        for ax in axes[:, col]:
            harness.size_axis(ax)
    harness.save_figure(fig, path, title)


def tuned_collectives():
    """The collectives an algorithm other than the ring plans (all_reduce first), where their
    Communicator call takes algorithm=."""
    return [c for c in COLLECTIVES_WITH_ALGORITHM if run.takes_algorithm(COLLECTIVES[c])]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--merge" in argv:
        return main_merge(argv)
    # run.py's parser: the later of repeated options wins, so the caller's come last.
    run.main(DEFAULTS + ["--collective", ",".join(tuned_collectives())] + argv, report=report)


if __name__ == "__main__":
    main()
