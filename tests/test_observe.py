"""What users see of ringcomm in their own tools (ringcomm/observe/): torch.profiler ranges
named ringcomm:<call> with shapes and dtype, through the Communicator and the torch backend
alike, a DDP step's among them; the ringcomm logger's set-up and per-call lines under
RINGCOMM_LOG, and nothing by default. Real processes."""
import json
import logging

import torch
import torch.distributed as dist

from launcher import launch
from test_examples import run_example


def ranges(prof, tmp):
    path = f"{tmp}/trace{dist.get_rank()}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("name", "").startswith("ringcomm:")]


def profiled(rank, n, tmp):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60)
    group = dist.new_group(backend="ringcomm")
    t, out = torch.ones(8), torch.empty(8 * n)
    with torch.profiler.profile(record_shapes=True) as prof:
        comm.all_reduce(t)
        comm.all_gather(out, t)
        comm.reduce_scatter(torch.empty(8), out)
        if rank == 0:
            comm.send(t, dst=1)
        elif rank == 1:
            comm.recv(t, src=0)
        dist.all_reduce(t, group=group)  # the torch backend: one range, not one per layer
        dist.all_gather_into_tensor(out, t, group=group)
    comm.close()
    return [(e["name"], e["args"].get("Collective name"), e["args"].get("dtype"),
             e["args"].get("Input Dims")) for e in ranges(prof, tmp)]


def test_every_call_is_a_named_profiler_range_with_shapes_and_dtype(tmp_path):
    results = launch(2, profiled, str(tmp_path))
    for rank, events in enumerate(results):
        names = [name for name, *_ in events]
        p2p = "ringcomm:send" if rank == 0 else "ringcomm:recv"
        assert names == ["ringcomm:all_reduce", "ringcomm:all_gather", "ringcomm:reduce_scatter",
                         p2p, "ringcomm:all_reduce", "ringcomm:all_gather"], names
        for name, collective, dtype, dims in events:
            assert name == f"ringcomm:{collective}" and dtype == "float32", (name, dtype)
        assert events[0][3] == [[8]] and events[1][3] == [[16], [8]], events


def test_a_ddp_step_shows_its_all_reduce_ranges(tmp_path):
    trace = tmp_path / "ddp.json"
    out = run_example("profile_ddp.py", "--steps", "3", "--trace", str(trace))
    assert "ringcomm:all_reduce x3" in out and "ringcomm:broadcast" in out, out
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("name") == "ringcomm:all_reduce"]
    assert len(events) == 3 and all(e["args"]["Collective name"] == "all_reduce" for e in events)


def logged(rank, n):
    import ringcomm

    records = []

    class Keep(logging.Handler):  # a user's own handler: routed like any logger's records
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))

    logging.getLogger("ringcomm").addHandler(Keep())
    comm = ringcomm.Communicator(timeout=60)
    comm.all_reduce(torch.ones(8))
    comm.all_gather(torch.empty(8 * n), torch.ones(8))
    comm.close()
    return records


def test_the_log_says_nothing_by_default():
    for records in launch(2, logged):
        assert records == [], records


def test_info_describes_each_rank_at_set_up_and_trace_each_call():
    for rank, records in enumerate(launch(2, logged, env={"RINGCOMM_LOG": "TRACE"})):
        info = [m for level, m in records if level == "INFO"]
        assert len(info) == 1 and f"rank {rank}/2" in info[0], records
        assert f"links {1 - rank}:shm" in info[0] and "slot" in info[0], info
        assert "pinned to CPUs" in info[0] or "not pinned" in info[0], info
        trace = [m for level, m in records if level == "TRACE"]
        assert len(trace) == 2, records
        assert "all_reduce float32 x 8 (32 B, one_shot)" in trace[0], trace
        assert "all_gather" in trace[1] and "B, ring)" in trace[1], trace
    for records in launch(2, logged, env={"RINGCOMM_LOG": "INFO"}):
        assert [level for level, _ in records] == ["INFO"], records
