"""Host-side logic of the GPU path, checked without a GPU: the NCCL-id rendezvous across ranks
on different devices (real processes and a real store; only the CUDA calls are stand-ins)."""
import pytest

from launcher import launch


class _FakeCudaC:
    """Stands in for the CUDA half of ringcomm._C: records what create() passes on."""

    RingcommError = RuntimeError

    def __init__(self, rank):
        self.rank = rank
        self.ids_made = 0

    def build_info(self):
        return {"cuda": True}

    def cuda_available(self):
        return True

    def nccl_unique_id(self, library="", hint=""):
        self.ids_made += 1
        return b"id-%d-from-rank-%d" % (self.ids_made, self.rank)

    class _Transport(dict):
        def set_peer_links(self, links):  # the communicator's, here the transport itself
            self["peer_links_are_the_ring"] = links is self

        def set_trace_buffer(self, calls):
            self["trace_buffer"] = calls

    class CudaTransportAndReducer:
        def __init__(self, rank, world_size, device, unique_id, **options):
            self.transport = _FakeCudaC._Transport({"rank": rank, "world_size": world_size, "device": device,
                              "id": unique_id, "options": options})
            self.reducer = None

        def release(self):
            pass

    @staticmethod
    def Communicator(rank, world_size, transport, reducer, slice_bytes):
        return transport


def _create_on_own_device(rank, world_size):
    from ringcomm import CommOptions
    from ringcomm.transport import cuda as cuda_backend
    from ringcomm.world.rendezvous import Rendezvous

    cuda_backend._C = _FakeCudaC(rank)  # this worker process only
    rendezvous = Rendezvous(None, timeout=20)
    options = CommOptions(timeout=20).resolved(world_size)
    # Rank r drives device r, as on a multi-GPU node; a second CUDA backend gets ordinal 1.
    first = cuda_backend.create(rendezvous, rank, options)
    second = cuda_backend.create(rendezvous, world_size + rank, options, ordinal=1)
    return dict(first), dict(second)


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_id_is_keyed_by_communicator_not_device(world):
    results = launch(world, _create_on_own_device, timeout=60)
    for rank, (first, second) in enumerate(results):
        assert first["device"] == rank and second["device"] == world + rank
        assert (first["id"], second["id"]) == (b"id-1-from-rank-0", b"id-2-from-rank-0")
        assert (first["rank"], first["world_size"]) == (rank, world)
        # Point-to-point runs over the ring's own NCCL communicator, which reaches every rank.
        assert first["peer_links_are_the_ring"] and second["peer_links_are_the_ring"]
        # The resolved CommOptions reach the ring: CUDA's default slice, the communicator's timeout.
        assert first["options"]["slice_bytes"] == 4 << 20 and first["options"]["timeout"] == 20


from ringcomm import _C  # noqa: E402


def test_shared_gpu_env_picks_the_nccl_path():
    """Ranks sharing one GPU: NCCL >= 2.30.3 is asked to allow it; older NCCL (2.30.0-2.30.2
    included, which lack the switch) sees each rank as its own host (a different NCCL_HOSTID),
    talking over loopback. On both paths NVLS and multi-node NVLink are off and NCCL's kernels
    use few CTAs."""
    from ringcomm.transport.cuda import shared_gpu_env

    both = {"NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0", "NCCL_MAX_CTAS": "8"}
    for version in (23003, 23200):
        assert shared_gpu_env(1, 2, nccl_version=version, environ={}) == {
            "NCCL_MULTI_RANK_GPU_ENABLE": "1", **both}
    for version in (22809, 22907, 23000, 23002):
        old = [shared_gpu_env(r, 2, nccl_version=version, environ={}) for r in range(2)]
        for env in old:
            assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_IB_DISABLE"] == "1"
            assert {k: env[k] for k in both} == both
            assert "NCCL_MULTI_RANK_GPU_ENABLE" not in env
        assert old[0]["NCCL_HOSTID"] != old[1]["NCCL_HOSTID"]


def test_more_than_two_ranks_on_a_gpu_take_the_host_id_path_on_any_nccl():
    """NCCL's multi-rank path allows at most 2 ranks per GPU (torch 2.14.1 brings NCCL 2.30.7):
    3 or more look like separate hosts, as on older NCCL."""
    from ringcomm.transport.cuda import shared_gpu_env

    for version in (22809, 23007, 23200):
        envs = [shared_gpu_env(r, 3, nccl_version=version, environ={}) for r in range(3)]
        assert all("NCCL_MULTI_RANK_GPU_ENABLE" not in env for env in envs), envs
        assert len({env["NCCL_HOSTID"] for env in envs}) == 3
        assert all(env["NCCL_SOCKET_IFNAME"] == "lo" for env in envs)


def test_shared_gpu_env_keeps_what_the_user_set():
    """A user's NCCL settings win; a user's NCCL_HOSTID still differs per rank (one shared host
    id would be "Duplicate GPU detected" again)."""
    from ringcomm.transport.cuda import shared_gpu_env

    user = {"NCCL_MAX_CTAS": "2", "NCCL_NVLS_ENABLE": "1", "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_HOSTID": "box"}
    old = [shared_gpu_env(r, 2, nccl_version=22809, environ=user) for r in range(2)]
    for rank, env in enumerate(old):
        assert env["NCCL_MAX_CTAS"] == "2" and env["NCCL_NVLS_ENABLE"] == "1"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["NCCL_MNNVL_ENABLE"] == "0" and env["NCCL_IB_DISABLE"] == "1"
        assert env["NCCL_HOSTID"].startswith("box") and str(rank) in env["NCCL_HOSTID"]
    assert old[0]["NCCL_HOSTID"] != old[1]["NCCL_HOSTID"]
    new = shared_gpu_env(0, 2, nccl_version=23003, environ=user)
    assert new["NCCL_MAX_CTAS"] == "2" and "NCCL_HOSTID" not in new


def test_shared_gpu_env_asks_the_nccl_ringcomm_loads():
    from launcher import shared_gpu_env as test_env
    from ringcomm.transport.cuda import MULTI_RANK_GPU_NCCL, SHARED_GPU_DEFAULTS, nccl_search

    if not _C.build_info()["cuda"]:
        pytest.skip("ringcomm was built without CUDA (no nvcc at build time)")
    try:
        version = _C.nccl_library(**nccl_search())[1]
    except _C.RingcommError as error:
        pytest.skip(f"NCCL's library (libnccl.so.2) could not be loaded: {str(error).splitlines()[0]}")
    env = test_env(0, 2)
    expected = ({"NCCL_MULTI_RANK_GPU_ENABLE"} if version >= MULTI_RANK_GPU_NCCL else
                {"NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"})
    assert set(env) == expected | set(SHARED_GPU_DEFAULTS)


def test_the_nccl_library_option_is_the_only_place_looked_at(tmp_path):
    """RINGCOMM_NCCL_LIBRARY (the nccl_library option) names NCCL's library: a wrong one is an
    error naming it, never a silent fall-back to another NCCL."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import ringcomm

    if not _C.build_info()["cuda"]:
        pytest.skip("ringcomm was built without CUDA (no nvcc at build time)")
    probe = ("from ringcomm import _C\nfrom ringcomm.transport import cuda\n"
             "_C.nccl_library(**cuda.nccl_search())")
    # A fresh process (NCCL is loaded once per process), importing this ringcomm.
    path = os.pathsep.join(filter(None, [str(Path(ringcomm.__file__).parent.parent),
                                         os.environ.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": path,
                                            "RINGCOMM_NCCL_LIBRARY": "/no/such/nccl"})
    assert run.returncode != 0
    assert "nccl_library=/no/such/nccl could not be used as NCCL" in run.stderr


def test_no_usable_gpu_names_the_cuda_error():
    """A machine whose driver is missing, or older than ringcomm's CUDA runtime, is told CUDA's
    own error, not a bare "no device" (torch may still see its GPUs through an older runtime)."""
    from ringcomm import _C
    from ringcomm.transport import cuda as cuda_backend
    from ringcomm.options import CommOptions

    if not _C.build_info()["cuda"]:
        pytest.skip("built without CUDA")
    if _C.cuda_available():
        pytest.skip("a CUDA device is usable here")
    reason = _C.cuda_unavailable_reason()
    assert reason == "the CUDA runtime sees no device" or (
        reason.startswith("cudaGetDeviceCount failed: cudaError") and "CUDA runtime is" in reason)
    with pytest.raises(_C.RingcommError) as raised:
        cuda_backend.create(None, 0, CommOptions())
    assert str(raised.value).endswith("no CUDA device is usable: " + reason)


# -- recorded collectives' settings ---------------------------------------------------------------

def test_cuda_graphs_turn_off_without_nccls_graph_mixing(caplog):
    """Replay runs recorded and eager NCCL work on one communicator (NCCL's graph mixing):
    NCCL_GRAPH_MIXING_SUPPORT=0 or NCCL_GRAPH_STREAM_ORDERING=0 turn cuda_graphs off, and the
    INFO log says so. On, NCCL_GRAPH_REGISTER=0 is set unless the user set it."""
    from ringcomm.transport.cuda import graphs_wanted

    caplog.set_level("INFO", logger="ringcomm")
    for name in ("NCCL_GRAPH_MIXING_SUPPORT", "NCCL_GRAPH_STREAM_ORDERING"):
        environ = {name: "0"}
        assert graphs_wanted(True, environ) is False
        assert environ == {name: "0"}
        assert f"cuda_graphs off: {name}=0" in caplog.text
    environ = {"NCCL_GRAPH_MIXING_SUPPORT": "1"}
    assert graphs_wanted(True, environ) is True
    assert environ["NCCL_GRAPH_REGISTER"] == "0"
    assert "cuda_graphs on: NCCL_GRAPH_REGISTER=0" in caplog.text
    mine = {"NCCL_GRAPH_REGISTER": "1"}
    assert graphs_wanted(True, mine) is True and mine == {"NCCL_GRAPH_REGISTER": "1"}
    untouched = {}
    assert graphs_wanted(False, untouched) is False and untouched == {}


def test_ring_arguments_carry_the_graphs_decision(monkeypatch):
    from ringcomm import CommOptions
    from ringcomm.transport import cuda

    options = CommOptions(timeout=5).resolved(2)
    monkeypatch.setenv("NCCL_GRAPH_STREAM_ORDERING", "0")
    assert cuda.ring_arguments(options)["cuda_graphs"] is False
    monkeypatch.delenv("NCCL_GRAPH_STREAM_ORDERING")
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")  # what graphs_wanted would set, undone after
    assert cuda.ring_arguments(options)["cuda_graphs"] is True


# -- Works of calls enqueued on a CUDA stream ---------------------------------------------------

class _Event:
    """A CUDA event as the Works use it: query() says whether the GPU got past it."""

    def __init__(self, done):
        self.done = done

    def query(self):
        return self.done


def test_a_work_on_a_stream_answers_is_completed_from_its_event():
    """The Future of a call enqueued on a CUDA stream completes at once: is_completed asks the
    event recorded after the call instead (the Communicator API's Work, and the backend's
    point-to-point Works)."""
    import torch

    from ringcomm.c10d.work import FutureWork
    from ringcomm.work import Work

    enqueued = torch.futures.Future()
    enqueued.set_result([])
    event = _Event(False)
    api, backend = Work(enqueued, done=event), FutureWork(enqueued, None, done=lambda: event)
    assert not api.is_completed() and not backend.is_completed() and not backend.is_success()
    event.done = True
    assert api.is_completed() and backend.is_completed() and backend.is_success()
    # Not yet posted (a batch still collecting its list): its Future says.
    assert FutureWork(torch.futures.Future(), None, done=lambda: None).is_completed() is False
