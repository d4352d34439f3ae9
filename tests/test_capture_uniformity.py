"""Every rank decides the same about graph replay. NCCL requires a send/receive pair to be
graph-captured on both sides or on neither (its user guide, "Using NCCL with CUDA Graphs"):
inside a capture it registers the capturing side's buffers only, which changes that side's
protocol. The host NCCL records a pair whose sides differ as a violation; these are the
ordinary programs in which ranks used to decide alone, run on it."""
import pytest
import torch
import torch.distributed as dist

from host_gpu_world import host_gpu, host_nccl_backend, raise_first, run_ranks  # noqa: I100

from ringcomm import _C
from ringcomm.c10d.backend import RingcommBackend
from ringcomm.c10d.process_group import group_over


@pytest.fixture(autouse=True)
def _no_ddp_module_left_active():
    """The ranks here are threads of the test process, and DDP's forward saves and restores one
    class-wide "active module": concurrent forwards can leave another rank's set after they end,
    and torch.compile in a later test's ranks (forked from this process) would then take that
    module's bucket size (DDPOptimizer: "First bucket should be smaller/equal ...")."""
    yield
    torch.nn.parallel.DistributedDataParallel._active_ddp_module = None


def _core(comm):
    return comm._router.communicator_for("cpu", -1)


def _no_violations():
    violations = host_gpu.violations()
    assert violations == [], violations[:3]


def _point_to_point_first(comm):
    """Rank 0 sends to rank 2 before the first collective; rank 1 takes no part. Then the same
    all_reduce on the same buffer, again and again."""
    core, r = _core(comm), comm.rank
    i32 = _C.DataType.int32
    message = torch.arange(5, dtype=torch.int32)
    if r == 0:
        core.send(message.data_ptr(), 5, i32, 2, 0)
    elif r == 2:
        core.recv(message.data_ptr(), 5, i32, 0, 0)
    bucket, wrong = torch.zeros(2000), []
    for round_ in range(4):
        bucket.fill_(r + round_)
        comm.all_reduce(bucket)
        wrong.append(int((bucket != 3 + 3 * round_).sum()))
    return wrong, message.tolist()


def test_point_to_point_before_the_first_collective_changes_no_decision():
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(3, _point_to_point_first))
    assert [wrong for wrong, _ in results] == [[0] * 4] * 3, results
    assert results[2][1] == [0, 1, 2, 3, 4]
    _no_violations()


def _in_group(comm, body):
    """body(pg) on a torch process group whose collectives run on `comm` (threads share one
    torch.distributed state: the group's ranks are recorded as init_process_group would)."""
    r, n = comm.rank, comm.world_size
    pg = group_over(RingcommBackend(None, r, n, None, communicator=comm), dist.HashStore())
    dist.distributed_c10d._world.pg_group_ranks[pg] = {q: q for q in range(n)}
    try:
        return body(pg)
    finally:
        del dist.distributed_c10d._world.pg_group_ranks[pg]


def _gathers(comm):
    """dist.gather three times: the backend gathers into a fresh flat buffer on the root only,
    and the root keeps what it gathered (its next buffer lands elsewhere)."""
    def body(pg):
        r, n = comm.rank, comm.world_size
        mine, kept, wrong = torch.full((3000,), float(r)), [], 0
        for _ in range(3):
            outputs = [torch.empty(3000) for _ in range(n)] if r == 0 else None
            dist.gather(mine, outputs, group=pg, group_dst=0)
            if r == 0:
                wrong += sum(int((o != q).sum()) for q, o in enumerate(outputs))
                kept.append(torch.empty(3000 * n))  # logging, say
        return wrong
    return _in_group(comm, body)


def test_gather_into_a_fresh_root_buffer_is_decided_alike():
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(3, _gathers))
    assert results == [0, 0, 0], results
    _no_violations()


class _Tracked(torch.nn.Module):
    """A layer with large buffers (running statistics): DDP broadcasts the module's buffers
    before every forward, flattened into a fresh buffer each time."""

    def __init__(self, width):
        super().__init__()
        self.register_buffer("sums", torch.zeros(width, 1024))
        self.register_buffer("squares", torch.zeros(width, 1024))

    def forward(self, x):
        if self.training:
            self.sums[:, 0] += x.detach().mean(0)
            self.squares[:, 0] += x.detach().square().mean(0)
        return x


def _small_bucket_ddp(pg):
    """(module, its DDP over `pg`): buckets of 10 KB, so every step reduces several."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), _Tracked(64), torch.nn.Linear(64, 8))
    return net, torch.nn.parallel.DistributedDataParallel(net, process_group=pg,
                                                          bucket_cap_mb=0.01)


def _train_step(model, optimizer, seed):
    data = torch.randn(16, 64, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    model(data).square().mean().backward()
    optimizer.step()


def _ddp_with_evaluation_on_rank_0(comm):
    """DDP over the torch backend, with rank 0 alone evaluating (and keeping what it logs)
    between training steps."""
    def body(pg):
        torch.manual_seed(0)
        net, model = _small_bucket_ddp(pg)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = []
        for step in range(4):
            _train_step(model, optimizer, comm.rank + step)
            if comm.rank == 0:
                net.eval()
                with torch.no_grad():
                    kept.append(net(torch.randn(256, 64)))  # evaluation, on this rank only
                    kept.append(torch.empty(2 * 64 * 1024))  # what it logs
                net.train()
        return [float(p.detach().sum()) for p in net.parameters()]
    return _in_group(comm, body)


def test_ddp_with_evaluation_on_one_rank_is_decided_alike():
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(2, _ddp_with_evaluation_on_rank_0))
    assert results[0] == results[1], results
    _no_violations()


def _tagged_after_point_to_point(comm):
    """As above, the all_reduce tagged (a DDP bucket's): recorded at its second call on every
    rank alike, whatever point-to-point came before."""
    core, r = _core(comm), comm.rank
    message = torch.arange(5, dtype=torch.int32)
    if r == 0:
        core.send(message.data_ptr(), 5, _C.DataType.int32, 2, 0)
    elif r == 2:
        core.recv(message.data_ptr(), 5, _C.DataType.int32, 0, 0)
    bucket, wrong = torch.zeros(2000), []
    for round_ in range(4):
        bucket.fill_(r + round_)
        comm.all_reduce(bucket, replay_tag=0)
        wrong.append(int((bucket != 3 + 3 * round_).sum()))
    return wrong


def test_a_tagged_collective_is_recorded_alike_after_point_to_point():
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(3, _tagged_after_point_to_point))
        calls = host_gpu.calls()
    assert results == [[0] * 4] * 3, results
    # Per rank: call 1 eager, call 2 recorded and launched, calls 3-4 launched.
    assert calls["cudaStreamBeginCapture"] == 3 and calls["cudaGraphLaunch"] == 3 * 3, calls
    _no_violations()


def _ddp_hook_with_evaluation_on_rank_0(comm):
    """The same training with ringcomm's DDP hook, which tags each bucket's all_reduce."""
    import ringcomm.ddp

    def body(pg):
        torch.manual_seed(0)
        net, model = _small_bucket_ddp(pg)
        model.register_comm_hook(ringcomm.ddp.HookState(comm, async_cpu=False),
                                 ringcomm.ddp.allreduce_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = []
        for step in range(5):
            _train_step(model, optimizer, comm.rank + step)
            if comm.rank == 0:
                with torch.no_grad():
                    kept.append(net(torch.randn(256, 64)))
                    kept.append(torch.empty(2 * 64 * 1024))
        return [float(p.detach().sum()) for p in net.parameters()]
    return _in_group(comm, body)


def test_ddp_buckets_are_replayed_alike_with_the_hook():
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(2, _ddp_hook_with_evaluation_on_rank_0))
        calls = host_gpu.calls()
    assert results[0] == results[1], results
    assert calls.get("cudaGraphLaunch", 0) > 0, "no bucket was replayed"
    _no_violations()


def _hook_state_tags(comm):
    import ringcomm.ddp

    first, second = ringcomm.ddp.HookState(comm), ringcomm.ddp.HookState(comm)
    bare = ringcomm.ddp._resolve(comm)
    assert ringcomm.ddp._resolve(comm) is bare  # a bare communicator keeps its tags
    return first.first_replay_tag, second.first_replay_tag, bare.first_replay_tag


def test_each_models_hook_state_has_tags_of_its_own_alike_on_every_rank():
    """Two DDP models on one communicator: their buckets 0, 1, ... must not share replay tags
    (a replay on the other model's buffers is refused); every rank numbers them alike."""
    with host_nccl_backend(slice_bytes=1024, slots=2):
        results = raise_first(run_ranks(2, _hook_state_tags))
    assert results[0] == results[1] and len(set(results[0])) == 3, results
