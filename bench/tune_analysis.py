"""The analysis of a tune.py sweep (pure functions of its records): per collective, each size's
median times, spreads, ratios and fastest algorithm; the thresholds that lose the least against
the fastest, chosen by the communicator's own rule; the selector check; and the latency and
bandwidth targets."""
import dataclasses
import itertools
import math

import ringcomm
from ringcomm.options import THRESHOLDS, CommOptions

SELECTOR, REFERENCE, BASELINE = "auto", "ring", "gloo"


@dataclasses.dataclass(frozen=True)
class Target:
    small_us: float  # 8 B all_reduce, at most
    small_vs_gloo: float  # 8 B all_reduce time over gloo's, at most


# Targets: 8 B within 1.5x of OpenMPI's shared-memory allreduce; 64 MiB busbw >= 3x gloo's.
TARGETS = {2: Target(6.0, 0.01), 4: Target(20.0, 0.015)}
SMALL, LARGE, LARGE_VS_GLOO = 8, 64 << 20, 3.0


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


def variant(records):
    """The records analysed: out-of-place where measured (the common call), else in-place."""
    inplace = all(r["inplace"] for r in records)
    return [r for r in records if r["inplace"] == inplace], inplace


def analyse_collective(records, world=4):
    """Rows per size (median, spread, ratios, fastest), thresholds and the selector check for
    one collective's records."""
    records, inplace = variant(records)
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
