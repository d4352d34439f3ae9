"""The torch backend's Works on CUDA tensors behave as NCCL's (one process, one rank): the call
is enqueued on the current stream, wait() orders the caller's current stream after it without
blocking the host, is_completed() asks the GPU, and the Future carries the device."""
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ringcomm  # noqa: E402,F401  (registers the backend)
from ringcomm import _C  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (_C.build_info()["cuda"] and _C.cuda_available()
                                      and torch.cuda.is_available()),
                                 reason="needs a CUDA GPU and ringcomm built with CUDA")]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("ringcomm", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_cuda_work_waits_on_the_gpu_not_the_host(group):
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    torch.cuda._sleep(int(2e9))  # keeps the current stream busy for about a second
    work = dist.all_reduce(t, async_op=True)
    assert not work.is_completed(), "is_completed() must ask the GPU, which is still busy"
    begun = time.perf_counter()
    work.wait()
    assert time.perf_counter() - begun < 0.5, "wait() blocked the host"
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        work.get_future().wait()  # orders the side stream after the collective
        copy = t * 1
    torch.cuda.synchronize()
    assert work.is_completed() and work.is_success()
    assert torch.equal(copy, torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
    assert work.get_future().value()[0].device.type == "cuda"
