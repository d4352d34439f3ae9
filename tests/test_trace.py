"""Flight record files and their analyzer: with ``trace_dir`` every rank writes its record when a
call fails and when it closes, and ``python -m ringcomm.trace DIR`` names the rank and the
collective to look at. Each failure is made for real, on 3 processes: a rank that skips a
collective, one that calls a different size, one killed mid-collective, one that stops
answering."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from launcher import die_soon, launch
from subprocesses import checkout_env

WORLD = 3


def analyse(directory):
    """The analyzer's report, run as users run it, and its one Diagnosis."""
    from ringcomm.observe import diagnosis

    # Run from the trace folder: `-m` puts the working folder first on the path, and a source
    # checkout there holds no compiled core where the package is installed.
    out = subprocess.run([sys.executable, "-m", "ringcomm.trace", str(directory)],
                         capture_output=True, text=True, env=checkout_env(), timeout=60,
                         cwd=directory)
    assert out.returncode == 0, out.stderr
    (found,) = diagnosis.analyse(str(directory))
    return out.stdout, found


def failing(rank, directory, body):
    """Runs body(comm) with a trace_dir; returns the error it raised (None if none)."""
    import ringcomm

    comm = ringcomm.Communicator(timeout=4, trace_dir=directory)
    try:
        body(rank, comm)
        error = None
    except ringcomm.RingcommError as e:
        error = str(e)
    comm.close()
    return error


def skips(rank, comm):
    for i in range(4):
        if rank == 1 and i == 2:
            continue  # rank 1 skips the third all_reduce
        comm.all_reduce(torch.ones(1000))


def test_a_rank_that_skips_a_collective_is_named(tmp_path):
    errors = launch(WORLD, lambda rank, n: failing(rank, str(tmp_path), skips))
    assert errors[1] is None and errors[0] and errors[2], errors
    report, d = analyse(tmp_path)
    assert d.collective == "all_reduce #3" and d.culprits == [1], report
    assert "rank 1 never entered all_reduce #3 (its last collective was all_reduce #2" in report


def other_size(rank, comm):
    for i in range(3):
        if rank == 2 and i == 1:
            time.sleep(0.3)  # it comes last: the others wait in the call it gets wrong
        comm.all_reduce(torch.ones(2000 if rank == 2 and i == 1 else 1000))


def test_a_rank_that_calls_a_different_size_is_named(tmp_path):
    errors = launch(WORLD, lambda rank, n: failing(rank, str(tmp_path), other_size))
    assert all(errors), errors
    report, d = analyse(tmp_path)
    assert d.collective == "all_reduce #1" and d.culprits == [2], report
    assert "ranks disagree on count at all_reduce #1: rank 0 1000, rank 1 1000, rank 2 2000" \
        in report, report


def killed(rank, comm):
    import torch.distributed as dist

    big = torch.ones(1 << 20)
    comm.all_reduce(big)
    if rank == 1:
        die_soon(dist.distributed_c10d._get_default_store())
    for _ in range(10000):
        comm.all_reduce(big)


def test_a_rank_killed_mid_collective_is_named(tmp_path):
    errors = launch(WORLD, lambda rank, n: failing(rank, str(tmp_path), killed), allow_exit={1})
    assert errors[0] and errors[2], errors
    report, d = analyse(tmp_path)
    assert d.culprits == [1] and d.collective.startswith("all_reduce #"), report
    assert "rank 1 wrote no file" in report
    failed = [line for line in report.splitlines() if " failed at step" in line]
    assert len(failed) == 2 and all("rank 1" in line for line in failed), report


def stops(rank, comm):
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    big = torch.ones(1 << 20)
    comm.all_reduce(big)
    if rank == 1:
        store.set("stopped_pid", str(os.getpid()))
        stop = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGSTOP))
        stop.start()  # mid-call: the process stays, and answers nothing
    try:
        for _ in range(10000):
            comm.all_reduce(big)
    finally:
        if rank == 0:  # every survivor has timed out by now: the stopped rank can go
            os.kill(int(store.get("stopped_pid")), signal.SIGKILL)


def test_a_rank_that_stops_answering_is_named(tmp_path):
    start = time.monotonic()
    errors = launch(WORLD, lambda rank, n: failing(rank, str(tmp_path), stops), allow_exit={1})
    assert errors[0] and errors[2] and time.monotonic() - start < 60, errors
    report, d = analyse(tmp_path)
    assert d.culprits == [1] and d.collective.startswith("all_reduce #"), report
    assert "rank 1 wrote no file" in report and "running" not in report, report


def completes(rank, n, directory):
    import ringcomm

    comm = ringcomm.Communicator(timeout=30, trace_dir=directory)
    comm.all_reduce(torch.ones(5), op="max")
    comm.broadcast(torch.ones(3, dtype=torch.int64), src=2)
    if rank == 0:
        comm.send(torch.ones(2), dst=1)
    elif rank == 1:
        comm.recv(torch.empty(2), src=0)
    asked = comm.write_flight_record(os.path.join(directory, "asked"))
    comm.close()
    return asked


def test_files_hold_every_call_with_its_fields_and_a_clean_run_reads_clean(tmp_path):
    asked = launch(WORLD, completes, str(tmp_path))
    assert all(os.path.exists(path) for path in asked)
    files = sorted(n for n in os.listdir(tmp_path) if n.endswith(".json"))
    assert len(files) == WORLD, files
    with open(tmp_path / files[1]) as f:
        record = json.load(f)
    assert record["format"] == "ringcomm-flight-record" and record["reason"] == "closed"
    assert record["rank"] == 1 and record["world_size"] == WORLD and record["failure"] is None
    reduce, broadcast, recv = record["calls"]
    assert (reduce["name"], reduce["dtype"], reduce["count"], reduce["op"], reduce["peer"]) == \
        ("all_reduce", "float32", 5, "max", None), reduce
    assert (broadcast["dtype"], broadcast["peer"], broadcast["op"]) == ("int64", 2, None)
    assert (recv["name"], recv["peer"], recv["sequence"], recv["count"]) == ("recv", 0, None, 2)
    assert reduce["algorithm"] and broadcast["algorithm"] == "ring"
    report, d = analyse(tmp_path)
    assert d.culprits == [] and d.collective is None and "every call completed" in report


def test_a_trace_dir_that_cannot_be_written_warns_and_closes(tmp_path, caplog):
    import torch.distributed as dist

    import ringcomm

    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a file where the folder should be
    comm = ringcomm.Communicator.from_store(dist.HashStore(), 0, 1, timeout=10,
                                            trace_dir=str(blocked))
    comm.all_reduce(torch.ones(2))
    with caplog.at_level("WARNING", logger="ringcomm"):
        comm.close()
    assert comm.closed and "could not write the flight record" in caplog.text
