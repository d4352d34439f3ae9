"""What tune.py prints and writes: per collective the table of median times and spreads, the
suggested thresholds, the selector check and the targets; the machine's load during the launch;
the JSON ({"records", "analysis", "environment"}) and the plot."""
import json
import os
import subprocess
import sys

import ringcomm
from machine_load import cpu_times, machine_load
from plots import save_figure, size_axis
from ringcomm.options import IN_HOST_ALGORITHMS
from sizes import format_size
from tune_analysis import (BASELINE, LARGE_VS_GLOO, REFERENCE, SELECTOR, TARGETS, analyse,
                           short, threshold_setting, variant)


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
        line = f"  {format_size(row['size']):>10}"
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
        where = f"up to {format_size(max_bytes)}" if max_bytes else "never"
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
    return [head] + [f"#   {format_size(v['size'])}: {_us(v['selector_us'])} us vs "
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
    load = machine_load(getattr(args, "cpu_before", {}), cpu_times())
    return {"nranks": world, "cores": os.cpu_count(), "loadavg_before": list(args.loadavg),
            "busy_processes": args.load, "rounds": args.rounds, "iters": args.iters,
            "warmup": args.warmup_iters, "algorithms": list(IN_HOST_ALGORITHMS),
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
        mine, _ = variant([r for r in records if r["collective"] == coll])
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
            size_axis(ax)
    save_figure(fig, path, title)
