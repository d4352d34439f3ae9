"""torch.compile over the "ringcomm" backend, in real processes, on a ringcomm default group and
on a ringcomm group beside a gloo default one: compiled DDP with the options users set,
functional collectives inside a compiled function, collectives at graph breaks, a compiled
DTensor tensor-parallel step; against the same runs on gloo, bit for bit at 2 ranks. Compiling
is slow, so each launch runs many cases and the tests below check one case each."""
import pytest
import torch
import torch._dynamo  # imported once here, not in every forked rank (DDP would import it)
import torch.distributed as dist
import torch.nn as nn
from torch._dynamo.utils import counters

import ringcomm
from launcher import launch
from ringcomm.c10d.backend import RingcommBackend
from ringcomm.c10d.process_group import backend_of

pytestmark = pytest.mark.system  # torch.compile runs a compiler

STEPS = 4


class Net(nn.Module):
    """BatchNorm's running statistics are buffers: DDP broadcasts them from rank 0 before every
    forward, from C++ inside the compiled call. unused: a layer forward never runs."""

    def __init__(self, width=64, unused=False):
        super().__init__()
        self.inp, self.norm = nn.Linear(16, width), nn.BatchNorm1d(width)
        self.mid = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.out = nn.Linear(width, 1)
        self.unused = nn.Linear(width, width) if unused else None

    def forward(self, x):
        x = torch.relu(self.norm(self.inp(x)))
        return self.out(torch.relu(self.mid(x)))


# case: (Net options, DDP options)
DDP_CASES = {
    "default": ({}, {}),
    "static_graph": ({}, dict(static_graph=True)),
    "gradient_as_bucket_view": ({}, dict(gradient_as_bucket_view=True)),
    "find_unused_parameters": (dict(unused=True), dict(find_unused_parameters=True)),
    # Under torch.compile a bucket holds at least DDP's first bucket (1 MiB): two 1 MiB layers
    # make several buckets, and so several graphs.
    "bucket_cap_mb": (dict(width=512), dict(bucket_cap_mb=1)),
}


def _compiled_ddp(rank, net_opts, ddp_opts, group):
    """Losses, parameters and buffers after STEPS compiled DDP steps; how many graphs Dynamo
    captured and how many (one per bucket) the backend compiled."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()  # every case compiles its own graphs (no recompile limit reached)
    counters.clear()
    torch.manual_seed(0)
    model = Net(**net_opts)
    step_fn = torch.compile(DDP(model, process_group=group, **ddp_opts))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 16, generator=g)
        opt.zero_grad()
        loss = nn.functional.mse_loss(step_fn(x), x[:, :1] * 0.5 - x[:, 1:2] ** 2)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return dict(losses=losses, params=[p.detach().numpy().copy() for p in model.parameters()],
                buffers=[b.numpy().copy() for b in model.buffers()],
                graphs=counters["stats"]["unique_graphs"],
                compiled=counters["aot_autograd"]["total"])


def as_ringcomm(rank, world_size, store_path):
    """Swaps the launcher's gloo default group for a "ringcomm" one."""
    dist.destroy_process_group()
    dist.init_process_group("ringcomm", init_method=f"file://{store_path}", rank=rank,
                            world_size=world_size)


def _ddp_runs(rank, world_size, store_path):
    torch.set_num_threads(1)
    runs = {}
    beside_gloo = dist.new_group(backend="ringcomm")
    assert isinstance(backend_of(beside_gloo), RingcommBackend)
    for name, (net_opts, ddp_opts) in DDP_CASES.items():
        runs["gloo", name] = _compiled_ddp(rank, net_opts, ddp_opts, None)
        runs["new_group", name] = _compiled_ddp(rank, net_opts, ddp_opts, beside_gloo)
    as_ringcomm(rank, world_size, store_path)
    for name, (net_opts, ddp_opts) in DDP_CASES.items():
        runs["default_group", name] = _compiled_ddp(rank, net_opts, ddp_opts, None)
    return runs


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    return launch(2, _ddp_runs, str(tmp_path_factory.mktemp("store") / "s"), timeout=600)


@pytest.mark.parametrize("group", ["default_group", "new_group"])
@pytest.mark.parametrize("case", list(DDP_CASES))
def test_compiled_ddp_matches_gloo_bit_for_bit(ddp_runs, group, case):
    for rank, runs in enumerate(ddp_runs):
        gloo, ours = runs["gloo", case], runs[group, case]
        assert ours["graphs"] >= 1 and gloo["graphs"] >= 1, "nothing was compiled"
        assert len(ours["losses"]) == STEPS
        assert ours["losses"] == gloo["losses"], f"rank {rank}"
        for what in ("params", "buffers"):
            for a, b in zip(gloo[what], ours[what], strict=True):
                assert (a == b).all(), f"rank {rank}: {what} differ from gloo's"
    for a, b in zip(ddp_runs[0][group, case]["params"], ddp_runs[1][group, case]["params"]):
        assert (a == b).all(), "ranks disagree"


def test_several_buckets_compile_to_several_graphs(ddp_runs):
    # Dynamo split the model at DDP's bucket boundaries: the option reached the compiled model.
    for runs in ddp_runs:
        for group in ("default_group", "new_group"):
            assert runs[group, "default"]["compiled"] == 1
            assert runs[group, "bucket_cap_mb"]["compiled"] > 1


# -- functional collectives and tensor parallelism ------------------------------------------------


def _collectives(x, group):
    """Compiled whole (fullgraph): the collectives are ops of the graph, which calls the backend
    and waits on its Works from C++."""
    import torch.distributed._functional_collectives as funcol

    summed = funcol.all_reduce(x * 2, "sum", group)
    gathered = funcol.all_gather_tensor(x + 1, 0, group)
    scattered = funcol.reduce_scatter_tensor(x, "sum", 0, group)
    return summed - 1, gathered, scattered * 3


def _at_graph_breaks(x, group):
    """Collectives Dynamo does not trace: it runs them eagerly between two graphs."""
    y = x * 2
    dist.barrier(group=group)
    dist.broadcast(y, src=0, group=group)
    return y + 1


def _tensor_parallel(rank, group):
    """Losses and full parameters of STEPS compiled tensor-parallel steps (DTensor: colwise
    then rowwise linear layers, whose forward and backward each end in an all_reduce)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    model = parallelize_module(model, DeviceMesh.from_group(group, "cpu"),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    step_fn = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))  # same on all ranks
        opt.zero_grad()
        loss = nn.functional.mse_loss(step_fn(x), torch.tanh(x.flip(1)))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return dict(losses=losses, params=[p.full_tensor().detach().numpy().copy()
                                       for p in model.parameters()])


def _functional_runs(rank, world_size, store_path):
    torch.set_num_threads(1)
    beside_gloo = dist.new_group(backend="ringcomm")
    runs = {}
    for name in ("gloo", "new_group", "default_group"):
        if name == "default_group":
            as_ringcomm(rank, world_size, store_path)
        group = beside_gloo if name == "new_group" else dist.group.WORLD
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(_collectives, fullgraph=True)
        results = []
        for call in range(2):
            x = torch.arange(2.0 * world_size) + 10 * rank + 100 * call
            results.append([t.numpy().copy() for t in compiled(x, group)])
        graphs = counters["stats"]["unique_graphs"]
        compiled = torch.compile(_at_graph_breaks)
        eager = [compiled(torch.full((3,), 10.0 * rank + call), group).numpy()
                 for call in range(2)]
        runs[name] = dict(collectives=results, graphs=graphs, eager=eager,
                          graphs_around_eager=counters["stats"]["unique_graphs"] - graphs)
        torch._dynamo.reset()
        runs[name]["tp"] = _tensor_parallel(rank, group)
    return runs


@pytest.fixture(scope="module")
def functional_runs(tmp_path_factory):
    return launch(2, _functional_runs, str(tmp_path_factory.mktemp("store") / "s"), timeout=600)


@pytest.mark.parametrize("group", ["gloo", "default_group", "new_group"])
def test_compiled_functional_collectives_exact(functional_runs, group):
    n = len(functional_runs)
    for rank, runs in enumerate(functional_runs):
        assert runs[group]["graphs"] == 1  # one graph for both calls: no break, no recompile
        for call, (summed, gathered, scattered) in enumerate(runs[group]["collectives"]):
            xs = [torch.arange(2.0 * n) + 10 * r + 100 * call for r in range(n)]
            assert torch.equal(torch.from_numpy(summed), 2 * sum(xs) - 1)
            assert torch.equal(torch.from_numpy(gathered), torch.cat(xs) + 1)
            assert torch.equal(torch.from_numpy(scattered), 3 * sum(xs)[2 * rank:2 * rank + 2])


@pytest.mark.parametrize("group", ["gloo", "default_group", "new_group"])
def test_collectives_at_graph_breaks(functional_runs, group):
    for runs in functional_runs:
        assert runs[group]["graphs_around_eager"] >= 2  # the collectives broke the graph
        for call, y in enumerate(runs[group]["eager"]):
            assert (y == 2 * call + 1).all()  # rank 0's, broadcast


@pytest.mark.parametrize("group", ["default_group", "new_group"])
def test_compiled_tensor_parallel_matches_gloo_bit_for_bit(functional_runs, group):
    for rank, runs in enumerate(functional_runs):
        gloo, ours = runs["gloo"]["tp"], runs[group]["tp"]
        assert len(ours["losses"]) == STEPS and ours["losses"] == gloo["losses"], f"rank {rank}"
        for a, b in zip(gloo["params"], ours["params"], strict=True):
            assert (a == b).all(), f"rank {rank}: parameters differ from gloo's"
    losses = functional_runs[0][group]["tp"]["losses"]
    assert losses[-1] < losses[0]  # it trains
