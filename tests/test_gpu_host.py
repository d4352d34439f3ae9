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

    def nccl_unique_id(self, hint):
        self.ids_made += 1
        return b"id-%d-from-rank-%d" % (self.ids_made, self.rank)

    class CudaRing:
        def __init__(self, rank, world_size, device, unique_id, **options):
            self.transport = {"rank": rank, "world_size": world_size, "device": device,
                              "id": unique_id, "options": options}
            self.reducer = None

        def release(self):
            pass

    @staticmethod
    def Communicator(rank, world_size, transport, reducer, slice_bytes):
        return transport


def _create_on_own_device(rank, world_size):
    from ringcomm import CommOptions, cuda_backend
    from ringcomm.rendezvous import Rendezvous

    cuda_backend._C = _FakeCudaC(rank)  # this worker process only
    rendezvous = Rendezvous(None, timeout=20)
    options = CommOptions(timeout=20).resolved(world_size)
    # Rank r drives device r, as on a multi-GPU node; a second CUDA backend gets ordinal 1.
    first = cuda_backend.create(rendezvous, rank, options)
    second = cuda_backend.create(rendezvous, world_size + rank, options, ordinal=1)
    return first, second


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_id_is_keyed_by_communicator_not_device(world):
    results = launch(world, _create_on_own_device, timeout=60)
    for rank, (first, second) in enumerate(results):
        assert first["device"] == rank and second["device"] == world + rank
        assert (first["id"], second["id"]) == (b"id-1-from-rank-0", b"id-2-from-rank-0")
        assert (first["rank"], first["world_size"]) == (rank, world)
        # The resolved CommOptions reach the ring: CUDA's default slice, the communicator's timeout.
        assert first["options"]["slice_bytes"] == 4 << 20 and first["options"]["timeout"] == 20


# -- NCCL groups: the ones NcclTransport issues, replayed without a GPU ------------------------------

from ringcomm import _C  # noqa: E402

PRIMITIVES = [kind.name for kind in _C.PLANNED_PRIMITIVES]  # point-to-point has no plan


def nccl_groups(primitive, n, count, root, slots, slot_bytes):
    """Every rank's groups, zero-byte operations dropped (the transport skips them)."""
    kind = _C.Primitive.__members__[primitive]
    ranks = []
    for r in range(n):
        groups = _C.testing.trace_nccl_groups(kind, r, n, count, root, _C.DataType.float32,
                                              slots, slot_bytes)
        groups = [[op for op in g if op[2] > 0] for g in groups]
        ranks.append([g for g in groups if g])
    return ranks


def replay(ranks):
    """NCCL's semantics on one stream per rank: groups run in order; a send and the receive it
    matches (the k-th message between two ranks, either way) complete together once both of
    their groups run; a group ends when all its operations have. Returns the ranks left stuck."""
    n = len(ranks)
    sent = {}  # (src, dst) -> messages so far, to number each op by pair order
    received = {}
    numbered = []
    for r, groups in enumerate(ranks):
        mine = []
        for g in groups:
            ops = []
            for kind, peer, size, *_ in g:
                key = (r, peer) if kind == "send" else (peer, r)
                table = sent if kind == "send" else received
                table[key] = table.get(key, 0) + 1
                ops.append((kind, key, table[key] - 1, size))
            mine.append(ops)
        numbered.append(mine)
    assert sent == received, "every send has a receive and the other way round"
    head = [0] * n
    done = [set() for _ in range(n)]  # completed op indices of the running group
    progressed = True
    while progressed:
        progressed = False
        running = {}
        for r in range(n):
            if head[r] < len(numbered[r]):
                for i, (kind, key, k, size) in enumerate(numbered[r][head[r]]):
                    running[(kind, key, k)] = (r, i, size)
        for (kind, key, k), (r, i, size) in running.items():
            if kind != "send" or i in done[r]:
                continue
            partner = running.get(("recv", key, k))
            if partner is not None:
                pr, pi, psize = partner
                assert psize == size, f"message {k} of {key}: {size} bytes sent, {psize} expected"
                done[r].add(i)
                done[pr].add(pi)
                progressed = True
        for r in range(n):
            if head[r] < len(numbered[r]) and len(done[r]) == len(numbered[r][head[r]]):
                head[r] += 1
                done[r] = set()
                progressed = True
    return [r for r in range(n) if head[r] < len(numbered[r])]


@pytest.mark.parametrize("primitive", PRIMITIVES)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_nccl_groups_match_up_and_never_deadlock(primitive, n):
    for count in (0, 1, n - 1, 1000, 12345):
        for slots in (2, 4, 8):
            for root in sorted({0, n - 1}):
                ranks = nccl_groups(primitive, n, count, root, slots, slot_bytes=256)
                stuck = replay(ranks)
                assert not stuck, (primitive, n, count, slots, root, stuck)


@pytest.mark.parametrize("primitive", ["all_reduce", "reduce_scatter", "all_gather"])
def test_symmetric_groups_pair_send_g_with_receive_g(primitive):
    """The pipelining: rank r's g-th group sends its g-th message and receives its g-th, so the
    send was produced W = slots/2 receives earlier and only waits for that kernel."""
    for n, slots in [(2, 4), (4, 8), (3, 2)]:
        for groups in nccl_groups(primitive, n, 100003, 0, slots, slot_bytes=4096):
            for g in groups:
                kinds = [op[0] for op in g]
                assert kinds == ["send", "recv"], g
                assert g[0][3] == g[1][3], "send g travels with receive g"


def test_replay_catches_a_deadlock():
    """The checker itself: a ring where every rank receives before it sends, in separate
    groups, is the classic deadlock."""
    ranks = [[[("recv", (r - 1) % 3, 8, 0, True)], [("send", (r + 1) % 3, 8, 0, True)]]
             for r in range(3)]
    assert replay(ranks) == [0, 1, 2]
    ranks = [[[("send", (r + 1) % 3, 8, 0, True), ("recv", (r - 1) % 3, 8, 0, True)]]
             for r in range(3)]
    assert replay(ranks) == []


def test_copy_only_steps_use_the_callers_buffers():
    """No staging copy where nothing is reduced: all_gather and broadcast move every message
    from and into user buffers; all_reduce stages only its reduce-scatter receives and the
    sends its kernels produce (the first send goes straight from the input)."""
    n, count = 4, 40000
    for primitive in ("all_gather", "broadcast"):
        for groups in nccl_groups(primitive, n, count, 0, 8, slot_bytes=4096):
            assert not any(op[4] for g in groups for op in g), primitive
    for groups in nccl_groups("all_reduce", n, count, 0, 8, slot_bytes=4096):
        ops = [op for g in groups for op in g]
        sends = sorted((op for op in ops if op[0] == "send"), key=lambda op: op[3])
        receives = sorted((op for op in ops if op[0] == "recv"), key=lambda op: op[3])
        columns = len(sends) // (2 * (n - 1))
        # Of the 2(n-1) steps, the n-1 that reduce stage their sends (the first step, the
        # first wave of messages, sends the input itself) and receive into slots; the copy
        # hops of the all-gather half receive into the output and send from there.
        assert sum(op[4] for op in sends) == (n - 1) * columns
        assert sum(op[4] for op in receives) == (n - 1) * columns
        wave = 8 // 2
        assert not any(op[4] for op in sends[:min(wave, columns)])


def test_a_scale_needs_a_floating_type_and_a_reducer_that_scales():
    """The fused scale is part of the reduce spec: the CPU reducer does not apply it, so the
    communicator refuses it there instead of silently ignoring it; a refused call leaves the
    communicator usable."""
    import numpy as np

    transport = _C.ShmTransport(0, 1, 64 * 1024, 4, 10.0, 0)
    comm = _C.Communicator(0, 1, transport, _C.CpuReducer(), 64 * 1024)
    x = np.arange(8, dtype=np.float32)
    with pytest.raises(_C.RingcommError, match="cannot scale"):
        comm.all_reduce(x.ctypes.data, 8, _C.DataType.float32, _C.RedOp.sum, scale=0.5)
    i = np.arange(8, dtype=np.int32)
    with pytest.raises(_C.RingcommError, match="floating type"):
        comm.all_reduce(i.ctypes.data, 8, _C.DataType.int32, _C.RedOp.sum, scale=0.5)
    comm.all_reduce(x.ctypes.data, 8, _C.DataType.float32, _C.RedOp.max)
    assert comm.failure == "" and (x == np.arange(8)).all()
    comm.close()


def test_shared_gpu_env_picks_the_nccl_path():
    """Ranks sharing one GPU: NCCL >= 2.30 is asked to allow it; older NCCL sees each rank as its
    own host (a different NCCL_HOSTID), talking over loopback."""
    from launcher import shared_gpu_env as test_env
    from ringcomm.cuda_backend import shared_gpu_env

    assert shared_gpu_env(3, nccl_version=23003) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    old = [shared_gpu_env(r, nccl_version=22809) for r in range(2)]
    assert all(env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_IB_DISABLE"] == "1" for env in old)
    assert old[0]["NCCL_HOSTID"] != old[1]["NCCL_HOSTID"]
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in old[0]
    if _C.build_info()["cuda"]:  # the default asks the NCCL ringcomm loads
        env = test_env(0)
        assert env["NCCL_MAX_CTAS"] and set(env) - {"NCCL_MAX_CTAS"} in (
            {"NCCL_MULTI_RANK_GPU_ENABLE"}, {"NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"})
