"""Reads every rank's flight record file (``trace_dir``; see
:mod:`ringcomm.observe.flight_record`) and says in one screen what went wrong: the first
collective that did not complete on every rank, the rank(s) that never entered it, ranks that
disagree on its name, dtype, size, op or root, the ring step where each rank stopped and why,
and ranks that wrote no file.

    python -m ringcomm.trace /tmp/ringcomm-trace
"""
import argparse
import sys
from collections import Counter
from typing import List, NamedTuple, Optional

from . import flight_record

# What every rank must agree on for one collective (its number lines them up).
AGREED = ("name", "dtype", "count", "op", "peer")


class Diagnosis(NamedTuple):
    communicator: str
    world_size: int
    collective: Optional[str]  # "all_reduce #4": the first that did not complete everywhere
    culprits: List[int]  # the ranks to look at first
    lines: List[str]  # the report, a finding a line


def describe(entry):
    """'all_reduce #4 float32 x1000 sum' for a record entry."""
    words = [entry["name"]]
    if entry.get("sequence") is not None:
        words.append(f"#{entry['sequence']}")
    if entry.get("dtype"):
        words.append(f"{entry['dtype']} x{entry['count']}")
    if entry.get("op"):
        words.append(entry["op"])
    if entry.get("peer") is not None:
        words.append(("root " if entry.get("sequence") is not None else "peer ")
                     + str(entry["peer"]))
    return " ".join(words)


def progress(entry):
    """'failed at step 3 of 6: <first line of the failure>'."""
    text = entry["state"]
    if entry.get("steps"):
        text += f" at step {max(entry['step'], 0)} of {entry['steps']}"
    if entry.get("failure"):
        text += ": " + entry["failure"].splitlines()[0]
    return text


def _collectives(record):
    """{(backend, sequence): entry} of a rank's record."""
    return {(e["backend"], e["sequence"]): e for e in record["calls"]
            if e.get("sequence") is not None}


def _first_open(by_rank):
    """The collective to explain, (backend, sequence), or None: the first that ranks disagree
    on, else the first that some rank never entered while another did, else the first that
    some rank did not complete (a rank still finishing one while its peers failed on the next
    is not the cause)."""
    calls = {rank: _collectives(record) for rank, record in by_rank.items()}
    keys = sorted({key for c in calls.values() for key in c})
    last = {(rank, backend): max((s for b, s in c if b == backend), default=-1)
            for rank, c in calls.items() for backend in {b for b, _ in keys}}

    def disagree(key):
        return len({tuple(c[key].get(f) for f in AGREED) for c in calls.values() if key in c}) > 1

    def never_entered(key):
        return any(key not in c and key[1] > last[rank, key[0]] for rank, c in calls.items())

    def unfinished(key):
        return any(key in c and c[key]["state"] != "completed" for c in calls.values())

    for test in (disagree, never_entered, unfinished):
        found = next((key for key in keys if test(key)), None)
        if found is not None:
            return found, calls
    return None, calls


def diagnose(communicator, by_rank):
    """The Diagnosis of one communicator's files, {rank: record}."""
    world = max(r["world_size"] for r in by_rank.values())
    missing = [r for r in range(world) if r not in by_rank]
    key, calls = _first_open(by_rank)
    lines, culprits, name = [], [], None
    if key is not None:
        entries = {rank: c[key] for rank, c in calls.items() if key in c}
        name = f"{next(iter(entries.values()))['name']} #{key[1]}"  # "all_reduce #4"
        for field in AGREED:
            counts = Counter(e.get(field) for e in entries.values()).most_common()
            if len(counts) > 1:
                # The odd ones out are those not holding the most common value; with a tie, all.
                usual = counts[0][0] if counts[0][1] > counts[1][1] else object()
                odd = sorted(r for r, e in entries.items() if e.get(field) != usual)
                culprits += [r for r in odd if r not in culprits]
                lines.append(f"ranks disagree on {field} at {name}: " + ", ".join(
                    f"rank {r} {entries[r].get(field)}" for r in sorted(entries)))
        for rank in sorted(set(calls) - set(entries)):
            mine = [e for (b, _), e in calls[rank].items() if b == key[0]]
            if mine and mine[-1]["state"] == "failed":  # stopped by the failure, not its cause
                lines.append(f"rank {rank} failed before {name}: {describe(mine[-1])} "
                             f"{progress(mine[-1])}")
                continue
            before = f"its last collective was {describe(mine[-1])}, {mine[-1]['state']}" \
                if mine else "it recorded no collective"
            lines.append(f"rank {rank} never entered {name} ({before})")
            culprits.append(rank)
        for rank, entry in sorted(entries.items()):
            if entry["state"] != "completed":
                lines.append(f"rank {rank}: {describe(entry)} {progress(entry)}")
    else:
        for rank, record in sorted(by_rank.items()):
            stuck = [e for e in record["calls"] if e["state"] not in ("completed", "enqueued")]
            for entry in stuck[-1:]:
                lines.append(f"rank {rank}: {describe(entry)} {progress(entry)}")
                culprits += [] if entry.get("peer") is None else [entry["peer"]]
    for rank in missing:
        lines.append(f"rank {rank} wrote no file: it was killed, stopped answering, or never "
                     "reached a failure or close")
    if not culprits:
        culprits = missing
    head = f"communicator {communicator} ({world} ranks, files from {len(by_rank)}): "
    if name is None and not lines:
        head += "every call completed on every rank"
    else:
        head += (f"{name} did not complete everywhere" if name else "a call failed") + (
            "; look at " + ", ".join(f"rank {r}" for r in culprits) if culprits else "")
    return Diagnosis(communicator, world, name, culprits, [head] + ["  " + l for l in lines])


def analyse(directory):
    """A Diagnosis per communicator with files in `directory`."""
    return [diagnose(c, by_rank) for c, by_rank in sorted(flight_record.read(directory).items())]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ringcomm.trace",
        description="Says what went wrong from every rank's ringcomm flight record file.")
    parser.add_argument("directory", help="the trace_dir (RINGCOMM_TRACE_DIR) the ranks wrote")
    args = parser.parse_args(argv)
    diagnoses = analyse(args.directory)
    if not diagnoses:
        print(f"no ringcomm flight record files in {args.directory}", file=sys.stderr)
        return 1
    for d in diagnoses:
        print("\n".join(d.lines))
    return 0

