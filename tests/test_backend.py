"""ringcomm as a torch.distributed backend ("ringcomm"): real processes, every collective torch
routes to a backend checked against an exact reference, DDP (no hook) bit-identical to gloo's,
FSDP2 on CPU, errors. Each launch runs many cases; the tests below check one case each."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ringcomm
from launcher import launch
from ringcomm.c10d.backend import RingcommBackend
from ringcomm.c10d.capabilities import BACKEND_PER_DEVICE
from ringcomm.c10d.process_group import _CALLS_WITH_WORK, backend_of
from ringcomm.ops import torch_reduce_ops
from sweep import DTYPES, make_input, op_valid, reduce_reference, wrong

# Every op of ringcomm's that torch.distributed has, by torch's member.
TORCH_OPS = torch_reduce_ops()
COUNTS = [0, 1, 2, 5, 1031]


def as_ringcomm(rank, world_size, store_path, **kwargs):
    """Swaps the launcher's gloo default group for a "ringcomm" one (left for the launcher to
    destroy)."""
    dist.destroy_process_group()
    dist.init_process_group("ringcomm", init_method=f"file://{store_path}", rank=rank,
                            world_size=world_size, **kwargs)


def blocks(world_size, count, dtype, salt):
    """Rank r's block: distinct small integers per rank and element."""
    return [(torch.arange(count) * world_size + r + salt).remainder(100).to(dtype)
            for r in range(world_size)]


def _collectives(rank, world_size, store_path):
    torch.set_num_threads(1)
    as_ringcomm(rank, world_size, store_path, timeout=datetime.timedelta(seconds=60))
    assert isinstance(backend_of(dist.group.WORLD), RingcommBackend)
    failures = []

    def check(name, actual, expected):
        bad = wrong(actual, expected)
        if bad:
            failures.append(f"rank {rank}: {name}: {bad} wrong ({actual[:6]} vs {expected[:6]})")

    n = world_size
    for dtype in DTYPES:
        for count in COUNTS:
            where = f"{dtype}, count {count}"
            for op, torch_op in TORCH_OPS.items():
                if not op_valid(op, dtype):
                    continue
                t = make_input(rank, n, count, op, dtype)
                work = dist.all_reduce(t, op=torch_op, async_op=(count == 5))
                if work is not None:
                    assert work.wait() and work.is_completed()
                    assert work.get_future().value()[0] is t
                check(f"all_reduce {op}, {where}", t, reduce_reference(n, count, op, dtype))
                t = make_input(rank, n, count, op, dtype)
                dist.reduce(t, dst=count % n, op=torch_op)
                expected = reduce_reference(n, count, op, dtype) if rank == count % n else \
                    make_input(rank, n, count, op, dtype)
                check(f"reduce {op}, {where}", t, expected)
            if dtype == torch.bool:
                continue  # the layouts below are dtype-blind; sums of bools are not
            mine = blocks(n, count, dtype, 0)
            out = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(out, mine[rank])
            check(f"all_gather, {where}", torch.cat(out), torch.cat(mine))
            out = torch.empty(n * count, dtype=dtype)
            dist.all_gather_into_tensor(out, mine[rank])
            check(f"all_gather_into_tensor, {where}", out, torch.cat(mine))
            # reduce_scatter: every rank contributes blocks(.., salt=rank)
            inputs = blocks(n, count, dtype, rank)
            expected = sum(blocks(n, count, torch.int64, r)[rank] for r in range(n)).to(dtype)
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out, inputs)
            check(f"reduce_scatter, {where}", out, expected)
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, torch.cat(inputs))
            check(f"reduce_scatter_tensor, {where}", out, expected)
            for root in range(n):
                t = mine[rank].clone()
                dist.broadcast(t, src=root)
                check(f"broadcast root {root}, {where}", t, mine[root])
            root = count % n
            gathered = [torch.empty(count, dtype=dtype) for _ in range(n)] if rank == root else None
            dist.gather(mine[rank], gathered, dst=root)
            if rank == root:
                check(f"gather, {where}", torch.cat(gathered), torch.cat(mine))
            out = torch.empty(count, dtype=dtype)
            dist.scatter(out, blocks(n, count, dtype, 7) if rank == root else None, src=root)
            check(f"scatter, {where}", out, blocks(n, count, dtype, 7)[rank])

    # Coalesced forms, non-contiguous tensors, barrier, objects, functional collectives.
    ts = [torch.full((k,), float(rank + k)) for k in (1, 3, 0, 4)]
    dist.all_reduce_coalesced(ts)
    for k, t in zip((1, 3, 0, 4), ts):
        check(f"all_reduce_coalesced {k}", t, torch.full((k,), float(sum(r + k for r in range(n)))))
    outs = [torch.empty(n * 3) for _ in range(2)]
    with dist._coalescing_manager():
        for i, out in enumerate(outs):
            dist.all_gather_into_tensor(out, torch.full((3,), float(10 * i + rank)))
    for i, out in enumerate(outs):
        check(f"coalesced all_gather_into_tensor {i}", out,
              torch.arange(n).repeat_interleave(3).float() + 10 * i)
    outs = [torch.empty(2) for _ in range(2)]
    with dist._coalescing_manager():
        for i, out in enumerate(outs):
            dist.reduce_scatter_tensor(out, torch.arange(2.0 * n) + i)
    for i, out in enumerate(outs):
        check(f"coalesced reduce_scatter_tensor {i}", out, (torch.arange(2.0) + 2 * rank + i) * n)
    lists = [[torch.empty(2), torch.empty(1)] for _ in range(n)]
    dist.all_gather_coalesced(lists, [torch.full((2,), float(rank)), torch.full((1,), -float(rank))])
    for r in range(n):
        check(f"all_gather_coalesced from {r}", torch.cat(lists[r]), torch.tensor([r, r, -r]).float())
    t = torch.arange(12.0).view(3, 4).t() * (rank + 1)  # not contiguous
    dist.all_reduce(t)
    check("all_reduce non-contiguous", t, torch.arange(12.0).view(3, 4).t() * sum(range(1, n + 1)))
    dist.barrier()
    assert dist.barrier(async_op=True).wait()
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    assert objects == [{"rank": r, "text": "x" * r} for r in range(n)], objects
    payload = [rank, "from", rank] if rank == 1 else [None, None, None]
    dist.broadcast_object_list(payload, src=1)
    assert payload == [1, "from", 1], payload

    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    check("functional all_reduce", funcol.all_reduce(torch.full((3,), float(rank)), "sum", group),
          torch.full((3,), float(sum(range(n)))))
    check("functional all_gather", funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, group),
          torch.arange(n).repeat_interleave(2).float())
    check("functional reduce_scatter",
          funcol.reduce_scatter_tensor(torch.arange(2.0 * n), "sum", 0, group),
          (torch.arange(2.0) + 2 * rank) * n)

    # Point to point: every ordered pair, blocking and isend/irecv both ways at once with
    # messages larger than a link holds (each side's send waits for the other's receive).
    for src in range(n):
        for dst in range(n):
            if src != dst and rank in (src, dst):
                if rank == src:
                    dist.send(torch.arange(5) + 10 * src + dst, dst, tag=src)
                else:
                    got = torch.empty(5, dtype=torch.int64)
                    dist.recv(got, src, tag=src)
                    check(f"send/recv {src}->{dst}", got, torch.arange(5) + 10 * src + dst)
    big = 1 << 20
    peer = rank ^ 1
    if peer < n:
        got = torch.empty(big)
        works = [dist.isend(torch.full((big,), float(rank)), peer, tag=9),
                 dist.irecv(got, peer, tag=9)]
        for w in works:
            w.wait()
        check("isend/irecv 4 MiB both ways", got, torch.full((big,), float(peer)))
    # torch's batch_isend_irecv, every rank listing its sends first: to every other rank, then
    # to the next one again (two messages of a pair, which match in order), 4 MiB each.
    others = [p for p in range(n) if p != rank]
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = {p: torch.empty(big) for p in others}
    again = torch.empty(big)
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.full((big,), 10.0 * rank + p), p, tag=5) for p in others]
        + [dist.P2POp(dist.isend, torch.full((big,), -1.0 - rank), nxt, tag=6)]
        + [dist.P2POp(dist.irecv, got[p], p, tag=5) for p in others]
        + [dist.P2POp(dist.irecv, again, prv, tag=6)])
    # torch >= 2.14 coalesces the list: one Work for all of it (as on NCCL).
    assert len(works) == (1 if BACKEND_PER_DEVICE else len(others) * 2 + 2), works
    for w in works:
        assert w.wait()
    for p in others:
        check(f"batch_isend_irecv from {p}", got[p], torch.full((big,), 10.0 * p + rank))
    check("batch_isend_irecv again from the previous rank", again, torch.full((big,), -1.0 - prv))
    # all_to_all_single with uneven splits, and the list form.
    rows = lambda s, d: (s + 2 * d) % 3 + (s == d)  # noqa: E731
    inp = torch.cat([torch.full((rows(rank, p), 2), 10.0 * rank + p) for p in range(n)])
    out = torch.empty(sum(rows(p, rank) for p in range(n)), 2)
    dist.all_to_all_single(out, inp, [rows(p, rank) for p in range(n)],
                           [rows(rank, p) for p in range(n)])
    check("all_to_all_single uneven", out,
          torch.cat([torch.full((rows(p, rank), 2), 10.0 * p + rank) for p in range(n)]))
    outs = [torch.empty(p + 1, dtype=torch.int32) for p in range(n)]
    dist.all_to_all(outs, [torch.full((rank + 1,), 100 * rank + p, dtype=torch.int32)
                           for p in range(n)])
    check("all_to_all list", torch.cat(outs),
          torch.cat([torch.full((p + 1,), 100 * p + rank, dtype=torch.int32) for p in range(n)]))

    # A sub-group on the backend (all ranks but the last, when there are more than two).
    members = list(range(max(1, n - 1)))
    sub = dist.new_group(members, backend="ringcomm")
    if rank in members:
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        check("new_group all_reduce", t, torch.full((4,), float(sum(r + 1 for r in members))))
    # Then a group of everyone: the ranks outside the first sub-group must still agree on it.
    everyone = dist.new_group(backend="ringcomm")
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=everyone)
    check("second new_group all_reduce", t, torch.full((2,), float(sum(range(n)))))
    return failures


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}ranks")
def collective_failures(request, tmp_path_factory):
    n = request.param
    return launch(n, _collectives, str(tmp_path_factory.mktemp("store") / "s"), timeout=300)


def test_every_collective_exact(collective_failures):
    failures = [f for rank_failures in collective_failures for f in rank_failures]
    assert not failures, "\n".join(failures[:20])


def _from_store(rank, world_size, store_path):
    dist.destroy_process_group()  # no default group: the communicator needs only a store
    store = dist.FileStore(store_path, world_size)
    comm = ringcomm.Communicator.from_store(store, rank, world_size, timeout=60)
    assert not dist.is_initialized()
    t = torch.arange(7) + rank
    comm.all_reduce(t)
    comm.close()
    with pytest.raises(ValueError, match="rank"):
        ringcomm.Communicator.from_store(store, world_size, world_size)
    return t.tolist()


def test_communicator_from_store_without_default_group(tmp_path):
    results = launch(2, _from_store, str(tmp_path / "store"), timeout=120)
    assert results == [[1 + 2 * i for i in range(7)]] * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                    nn.Linear(64, 1))
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        self.seen += 1
        return self.layers(x)


def _train(model, wrapped, rank, steps=8):
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 16, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(wrapped(x), x[:, :1] * 0.5).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_and_fsdp(rank, world_size, store_path):
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    results = {}
    for backend in ("gloo", "ringcomm"):
        if backend == "ringcomm":
            as_ringcomm(rank, world_size, store_path)
        torch.manual_seed(0)
        model = Net()
        results[backend] = _train(model, DDP(model, bucket_cap_mb=0.01), rank)
    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    results["fsdp2"] = [p.full_tensor() for p in _train(model, model, rank)]
    return {k: [p.numpy() for p in v] for k, v in results.items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return launch(2, _ddp_and_fsdp, str(tmp_path_factory.mktemp("store") / "s"), timeout=300)


def test_ddp_without_hook_bit_identical_to_gloo(trained):
    for rank, r in enumerate(trained):
        for gloo, ours in zip(r["gloo"], r["ringcomm"]):
            assert (gloo == ours).all(), f"rank {rank}: DDP on ringcomm differs from DDP on gloo"
    for a, b in zip(trained[0]["ringcomm"], trained[1]["ringcomm"]):
        assert (a == b).all(), "DDP ranks disagree"


def test_fsdp2_trains_like_ddp(trained):
    import numpy as np

    for rank, r in enumerate(trained):
        for ddp, fsdp in zip(r["ringcomm"], r["fsdp2"]):
            np.testing.assert_allclose(fsdp, ddp, rtol=1e-5, atol=1e-6)
    for a, b in zip(trained[0]["fsdp2"], trained[1]["fsdp2"]):
        assert (a == b).all(), "FSDP2 ranks disagree"


def _errors(rank, world_size, store_path):
    as_ringcomm(rank, world_size, store_path, timeout=datetime.timedelta(seconds=3))
    seen = {}

    def raised(name, call):
        try:
            call()
            seen[name] = None
        except Exception as error:  # the message is what a user sees
            seen[name] = f"{type(error).__name__}: {error}"

    # A receive from any source names its sender (here the only other rank).
    if rank == 1:
        dist.send(torch.full((3,), 7.0), 0, tag=5)
    else:
        got = torch.zeros(3)
        seen["recv_anysource"] = (dist.recv(got, tag=5), got.tolist())
    # A receive that fails on its thread raises from wait(), as the call itself would.
    pair = dist.new_group(backend="ringcomm")
    if rank == 1:
        dist.send(torch.ones(2), 0, group=pair, tag=6)
    else:
        raised("irecv_mismatch", lambda: dist.irecv(torch.zeros(3), 1, group=pair, tag=6).wait())
    raised("premul_sum", lambda: dist.all_reduce(
        torch.ones(2), op=dist._make_nccl_premul_sum(2.0)))
    raised("dtype", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)))
    raised("gather_list", lambda: dist.all_gather([torch.empty(1)], torch.ones(1)))
    # The hot path of contiguous CPU tensors honours the communicator's options too.
    os.environ["RINGCOMM_CHECK_FINITE"] = "1"
    checked = dist.new_group(backend="ringcomm")
    del os.environ["RINGCOMM_CHECK_FINITE"]
    bad = torch.tensor([1.0, float("nan") if rank == 1 else 2.0])
    raised("check_finite", lambda: dist.all_reduce(bad, group=checked))
    dist.barrier()
    # Rank 1 skips a collective: rank 0 times out (init_process_group's timeout), never hangs.
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        raised("timeout", lambda: dist.all_reduce(torch.ones(4)))
        raised("recv_anysource_timeout", lambda: dist.recv(torch.ones(1), tag=9))
        store.set("rank0-done", b"1")
    else:
        store.wait(["rank0-done"], datetime.timedelta(seconds=60))
    return seen


def test_errors_name_the_call_and_time_out(tmp_path):
    results = launch(2, _errors, str(tmp_path / "store"), timeout=120)
    assert results[0]["recv_anysource"] == (1, [7.0, 7.0, 7.0])
    assert results[0]["irecv_mismatch"].startswith("MismatchError"), results[0]["irecv_mismatch"]
    assert "CommTimeoutError" in results[0]["recv_anysource_timeout"] and \
        "recv from any source (tag 9)" in results[0]["recv_anysource_timeout"]
    for rank, seen in enumerate(results):
        assert "NotImplementedError" in seen["premul_sum"] and "PREMUL_SUM" in seen["premul_sum"]
        assert "TypeError" in seen["dtype"] and "torch.int16" in seen["dtype"]
        assert "ValueError" in seen["gather_list"] and "one per rank" in seen["gather_list"]
        assert seen["check_finite"].startswith("FloatingPointError") and \
            "rank 1 at index 1" in seen["check_finite"], seen["check_finite"]
    assert "CommTimeoutError" in results[0]["timeout"] or "timed out" in results[0]["timeout"], \
        results[0]["timeout"]


def test_bench_times_the_backend_path(tmp_path):
    """bench/run.py --baseline ringcomm-pg: every collective through dist.* on a "ringcomm" group,
    beside the direct Communicator, both checked."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(ringcomm.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(root / "bench" / "run.py"), "--device", "cpu",
                           "--nproc", "2", "-b", "8", "-e", "4K", "-f", "32", "-n", "2", "-w", "1",
                           "--collective", "all", "--baseline", "ringcomm-pg", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = json.loads(out.read_text())
    assert {r["impl"] for r in records} == {"ringcomm", "ringcomm-pg"}
    assert {r["collective"] for r in records} == set(ringcomm._C.COLLECTIVES)
    assert all(r["wrong"] == 0 for r in records), [r for r in records if r["wrong"]]
    assert "ringcomm/ringcomm-pg busbw" in proc.stdout


def _async(rank, world_size, store_path):
    as_ringcomm(rank, world_size, store_path, timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((1000,), float(rank + 1))
    seen = {}
    if rank == 1:  # joins only once rank 0 has seen its call return unfinished
        store.wait(["returned"], datetime.timedelta(seconds=60))
        dist.all_reduce(t)
    else:
        work = dist.all_reduce(t, async_op=True)
        seen["done_at_return"] = work.is_completed()
        seen["untouched_at_return"] = bool((t == 1.0).all())
        store.set("returned", b"1")
        work.wait()
    seen["result"] = t[:3].tolist()
    # Queued calls run in call order; a synchronous call runs after them; errors reach wait().
    works = [dist.all_reduce(torch.full((10,), float(i)), async_op=True) for i in range(3)]
    last = torch.ones(4)
    dist.all_reduce(last)
    seen["queued"] = [w.is_completed() for w in works] + [last.tolist()]
    # A queued collective's error reaches wait() (here the ranks disagree on the count).
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(5), async_op=True).wait()
        else:
            dist.all_reduce(torch.ones(6))
        seen["mismatch"] = None
    except Exception as error:
        seen["mismatch"] = type(error).__name__
    return seen


def test_async_all_reduce_returns_before_the_data_is_reduced(tmp_path):
    """The backend queues async_op collectives on the communicator's worker: the call returns
    while the peer has not even started, and wait() then gives the exact sum."""
    results = launch(2, _async, str(tmp_path / "store"), timeout=120)
    assert results[0]["done_at_return"] is False and results[0]["untouched_at_return"] is True
    for seen in results:
        assert seen["result"] == [3.0, 3.0, 3.0]
        assert seen["queued"] == [True, True, True, [2.0, 2.0, 2.0, 2.0]]
        assert seen["mismatch"] == "MismatchError", seen


def test_the_group_hands_every_call_with_a_work_to_its_backend():
    """On torch >= 2.14 the group runs each call that returns a Work on its backend itself
    (through c10d, torch would hand the caller a Work that forwards only wait()): a collective
    the backend defines but the group does not list would lose is_completed() there."""
    # Identity and life cycle, which reach the backend through c10d.
    through_c10d = {"getBackendName", "getGroupName", "setGroupName", "getGroupDesc",
                    "setGroupDesc", "abort", "shutdown", "get_reconfigure_handle", "reconfigure"}
    defined = {name for name, value in vars(RingcommBackend).items()
               if callable(value) and not name.startswith("__")
               and hasattr(dist.ProcessGroup, name)} - through_c10d
    assert defined and defined <= set(_CALLS_WITH_WORK), defined - set(_CALLS_WITH_WORK)
