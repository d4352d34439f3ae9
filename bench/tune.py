"""Which ringcomm algorithm where, measured: every algorithm ringcomm offers, beside gloo, in one
launch per world size; the selector's thresholds from the crossovers, and the latency and
bandwidth targets.

    python bench/tune.py                              # 2 ranks, all_reduce 8 B .. 64 MiB, x2 steps
    python bench/tune.py --nproc 4 --json t4.json --plot t4.png
    python bench/tune.py --nproc 2 --load 2           # the same beside 2 busy-looping processes
    python bench/tune.py -b 8 -e 1M -f 4 --rounds 9   # any bench/run.py option

A bench/run.py run with these defaults: every name in ringcomm.options.IN_HOST_ALGORITHMS
(--algorithm), for all_reduce and for each collective whose Communicator call takes algorithm= (detected),
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
import json
import statistics
import sys

import run  # bench/run.py: the launcher (it finds ringcomm in a source checkout too)
from collectives import COLLECTIVES
from records import spread
from tune_report import environment, publish

from ringcomm.options import COLLECTIVES_WITH_ALGORITHM, IN_HOST_ALGORITHMS  # noqa: E402

# Inside one host: the algorithms that run on shared memory (not those between hosts).
DEFAULTS = ["-b", "8", "-e", "64M", "-f", "2", "-n", "20", "-w", "3", "--rounds", "6",
            "--algorithm", ",".join(IN_HOST_ALGORITHMS)]


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
        r["spread_us"] = spread(seconds) * 1e6
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
