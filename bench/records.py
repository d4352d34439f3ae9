"""One measurement's record (the JSON layout of --json) and the statistics in it: the median of
the rounds, their spread, and the per-call percentiles."""
import json
import statistics


def record(coll, settings, nranks, device, impl, count, nbytes, inplace, rounds, calls, wrong,
           sent=()):
    """The record of one collective, implementation, size and variant: `rounds` are each round's
    time (s, the slowest rank's), `calls` each call's (s, the slowest rank's), `wrong` the
    #wrong elements over every rank (None: not checked), `sent` each round's bytes sent or
    published per call (the rank that moved most; empty where the implementation does not
    count)."""
    seconds = statistics.median(rounds)
    algbw = nbytes / seconds / 1e9
    # Bytes a rank sends or publishes per byte of the collective's size: ring all_reduce's
    # 2(N-1)/N, one_shot's 1 (its whole input, once, read by every rank).
    moved_per_byte = statistics.median(sent) / nbytes if sent and nbytes else None
    return {"collective": coll.name, "impl": impl, "size": nbytes, "count": count,
            "type": settings.type_name, "redop": settings.op if coll.has_op else "none",
            "root": settings.root if coll.has_root else -1, "inplace": inplace,
            "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * coll.bus_factor(nranks),
            "wrong": wrong, "nranks": nranks, "device": device.type,
            "rounds_us": [t * 1e6 for t in rounds], "spread_us": spread(rounds) * 1e6,
            # Per call (slowest rank each): a mean hides a split between fast calls and
            # scheduler-slice-long ones; the median and the 99th percentile do not.
            "p50_us": percentile(calls, 50) * 1e6, "p99_us": percentile(calls, 99) * 1e6,
            "calls": len(calls), "moved_per_byte": moved_per_byte}


def percentile(values, q):
    """The q-th percentile (linear between the nearest ranks, as numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def spread(values):
    """The interquartile range: how far the middle half of the rounds lies apart (0 for one)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def write_json(path, records):
    with open(path, "w") as f:
        json.dump(records, f, indent=1)

