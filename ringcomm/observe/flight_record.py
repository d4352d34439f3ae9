"""Flight record files: where ``trace_dir`` is set, each rank writes its communicator's flight
record (its last calls, :meth:`ringcomm.Communicator.flight_record`) to one JSON file when a
call fails, when the communicator is aborted and when it closes, and ``python -m ringcomm.trace
DIR`` (:mod:`ringcomm.observe.diagnosis`) reads every rank's file together.

A file, ``<trace_dir>/ringcomm-<communicator>-rank<rank>.json``, holds one object::

    {"format": "ringcomm-flight-record", "version": 1,
     "communicator": "0.0",        # the same on every rank of one communicator
     "rank": 1, "world_size": 4,   # in the communicator
     "global_rank": 1,             # in torch.distributed's world, where it is initialised
     "host": "node7", "pid": 4242, "written": 1733333333.2,  # Unix seconds
     "reason": "failed" | "aborted" | "closed" | "asked",
     "failure": "the first failure's message, or null",
     "calls": [ ... flight_record()'s dicts, oldest first ... ]}

The file is replaced each time (written beside, then renamed), so a reader never sees half of
one.
"""
import json
import logging
import os
import socket
import time
import weakref

import torch.distributed as dist

FORMAT, VERSION = "ringcomm-flight-record", 1


def queued(queue):
    """Entries for the calls an InOrderQueue holds that have not started, oldest first."""
    return [{"backend": "queue", "call": None, "name": name, "sequence": None, "dtype": None,
             "count": 0, "op": None, "algorithm": None, "peer": None, "state": "queued",
             "step": -1, "steps": 0, "started": queued_at, "ended": 0.0, "failure": ""}
            for name, queued_at in list(queue.pending)]


def path_for(directory, communicator, rank):
    """The file rank `rank` of the communicator labelled `communicator` writes in `directory`."""
    label = communicator.replace("/", "_")
    return os.path.join(directory, f"ringcomm-{label}-rank{rank}.json")


class FlightRecorder:
    """Writes one communicator's flight record file, where it has a ``trace_dir``, and keeps
    its first failure's message through later writes. The calls come from whoever writes (the
    communicator's router: :meth:`ringcomm.Communicator.flight_record`)."""

    def __init__(self, label, rank, world_size, directory):
        """`label`: the communicator's, the same on every rank (Rendezvous.label); `directory`:
        the ``trace_dir`` option (empty: nothing is written unless asked)."""
        self.label, self.rank, self.world_size, self.directory = label, rank, world_size, directory
        self.first_failure = None

    def watch(self, c_comm, calls):
        """Writes the record whenever the backend `c_comm` fails a call (on the failing thread),
        where there is a ``trace_dir``; `calls()`: the record, a bound method, held weakly so
        that the C++ side does not keep its owner alive."""
        if not self.directory:
            return
        calls = weakref.WeakMethod(calls)

        def failed():
            read = calls()
            if read is not None:
                self.write_or_warn(read(), "failed")
        c_comm.set_failure_hook(failed)

    def write_or_warn(self, calls, reason):
        """write(), where a file that cannot be written is a warning on the ``ringcomm`` logger:
        a failure, an abort or a close goes on without it."""
        try:
            return self.write(calls, reason)
        except OSError as error:
            logging.getLogger("ringcomm").warning("could not write the flight record: %s", error)
            return None

    def write(self, calls, reason, directory=None):
        """Writes `calls` (flight_record()'s dicts) as this rank's file in `directory` (default:
        the ``trace_dir``); returns the file's path, or None where there is no directory."""
        directory = directory or self.directory
        if not directory:
            return None
        failures = [c["failure"] for c in calls if c["state"] == "failed"]
        if failures and self.first_failure is None:
            self.first_failure = failures[0]
        in_world = dist.is_available() and dist.is_initialized()
        record = {
            "format": FORMAT, "version": VERSION,
            "communicator": self.label, "rank": self.rank, "world_size": self.world_size,
            "global_rank": dist.get_rank() if in_world else None,
            "host": socket.gethostname(), "pid": os.getpid(), "written": time.time(),
            "reason": reason, "failure": self.first_failure,
            "calls": calls,
        }
        os.makedirs(directory, exist_ok=True)
        path = path_for(directory, self.label, self.rank)
        partial = f"{path}.{os.getpid()}.part"
        with open(partial, "w") as out:
            json.dump(record, out, indent=1)
        os.replace(partial, path)
        return path


def read(directory):
    """Every flight record file in `directory`, as {communicator: {rank: record}}."""
    found = {}
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("ringcomm-") and name.endswith(".json")):
            continue
        with open(os.path.join(directory, name)) as f:
            record = json.load(f)
        if record.get("format") != FORMAT:
            continue
        found.setdefault(record["communicator"], {})[record["rank"]] = record
    return found
