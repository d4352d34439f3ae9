"""The per-call latency bench's layers: the core's own loop (_C.Communicator.time_runs) runs the
request it is given, and bench/call_latency.py reports every layer. No timing assertions."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ringcomm
from ringcomm import _C

ROOT = Path(__file__).resolve().parent.parent


def test_the_core_loop_runs_the_request_as_many_times_as_asked():
    # One rank: a sum over one rank leaves the data. A broadcast from a rank that is not there
    # must fail, not be timed.
    comm = ringcomm.Communicator.from_store(dist.HashStore(), 0, 1, timeout=10)
    try:
        t = torch.arange(7, dtype=torch.float32)
        comm.all_reduce(t)  # sets up the ring
        c_comm = comm._router.communicator_for("cpu", -1)
        request = _C.CollectiveRequest(_C.Collective.all_reduce, t.data_ptr(), 0, t.numel(),
                                       _C.DataType.float32, _C.RedOp.sum)
        nanos = c_comm.time_runs(request, 25)
        assert len(nanos) == 25 and all(n > 0 for n in nanos)
        assert torch.equal(t, torch.arange(7, dtype=torch.float32))
        assert c_comm.time_runs(request, 0) == []
        bad = _C.CollectiveRequest(_C.Collective.broadcast, t.data_ptr(), 0, t.numel(),
                                   _C.DataType.float32, _C.RedOp.sum, 3)
        with pytest.raises(Exception, match="src=3 is not a rank"):
            c_comm.time_runs(bad, 3)
    finally:
        comm.close()


@pytest.mark.system
def test_call_latency_reports_every_layer():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "call_latency.py"), "--blocks", "2",
                          "--calls", "5", "--warmup", "5"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                             str(Path(ringcomm.__file__).parent.parent),  # the one under test
                             os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for layer in ("core loop (C++)", "Communicator.all_reduce", "dist.all_reduce (ringcomm group)",
                  "Communicator, trace_buffer=0", "dist.all_reduce (no-op C++ backend)",
                  "flight record's cost"):
        assert layer in out.stdout, out.stdout
