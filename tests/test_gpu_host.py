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

    class _Transport(dict):
        def set_peer_links(self, links):  # the communicator's, here the transport itself
            self["peer_links_are_the_ring"] = links is self

    class CudaRing:
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
    from ringcomm import CommOptions, cuda_backend
    from ringcomm.rendezvous import Rendezvous

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


# -- NCCL groups: the ones NcclTransport issues, replayed without a GPU ------------------------------

from ringcomm import _C  # noqa: E402

PRIMITIVES = [kind.name for kind in _C.PLANNED_PRIMITIVES]  # point-to-point has no plan


def nccl_groups(primitive, n, count, root, slots, slot_bytes):
    """Every rank's groups, zero-byte operations dropped (the transport skips them)."""
    kind = _C.Primitive.__members__[primitive]
    ranks = []
    for r in range(n):
        ranks.append(_nonempty(_C.testing.trace_nccl_groups(kind, r, n, count, root,
                                                            _C.DataType.float32, slots, slot_bytes)))
    return ranks


def _nonempty(groups):
    groups = [[op for op in g if op[2] > 0] for g in groups]
    return [g for g in groups if g]


def p2p_groups(programs, slots=4, slot_bytes=256):
    """Every rank's groups for its program of ("send", peer, count), ("recv", peer, count) and
    ("all_to_all", send_counts, recv_counts), as the real Communicator issues them on NCCL."""
    return [_nonempty(_C.testing.trace_nccl_p2p(r, len(programs), program, _C.DataType.float32,
                                                slots, slot_bytes))
            for r, program in enumerate(programs)]


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


# -- point to point and all-to-all on NCCL, replayed the same way ----------------------------------

import random  # noqa: E402

SPLITS = (0, 0, 1, 3, 7, 1000, 12345)


def _all_to_all(n, seed):
    """send_counts per rank (uneven, with zeros); rank r receives from p what p sends to r."""
    rng = random.Random(seed)
    counts = [[rng.choice(SPLITS) for _ in range(n)] for _ in range(n)]
    return [("all_to_all", counts[r], [counts[p][r] for p in range(n)]) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8])
def test_all_to_all_groups_match_up_and_never_deadlock(n):
    for seed in range(6):
        calls = _all_to_all(n, seed)
        ranks = p2p_groups([[call] for call in calls])
        assert not replay(ranks), (n, seed)
        for r, groups in enumerate(ranks):
            # One group per step with both directions, straight from and into user buffers.
            assert len(groups) <= n - 1 and not any(op[4] for g in groups for op in g)
            for g in groups:
                assert [op[0] for op in g] in (["send", "recv"], ["send"], ["recv"]), g
    zeros = [("all_to_all", [0] * n, [0] * n)] * n
    assert p2p_groups([[call] for call in zeros]) == [[]] * n


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_send_recv_groups_match_up_in_call_order(n):
    """Pairs that meet (in a shift, even ranks send first and odd ranks receive first; across
    the middle, the lower rank of each pair sends first), mixed with all-to-all calls and
    zero-byte messages: every message finds its partner in order."""
    programs = [[] for _ in range(n)]
    for shift, count in [(1, 5), (n - 1, 0), (1, 12345), (n // 2, 1)]:
        for r in range(n):
            to, frm = (r + shift) % n, (r - shift) % n
            send, recv = ("send", to, count), ("recv", frm, count)
            first = r % 2 == 0 if 2 * shift != n else r < to
            programs[r] += [send, recv] if first else [recv, send]
    for r, call in enumerate(_all_to_all(n, 1)):
        programs[r].append(call)
    for r in range(n):  # rank 0 talks to every rank, one message each way
        if r:
            programs[0] += [("send", r, r), ("recv", r, 2 * r)]
            programs[r] += [("recv", 0, r), ("send", 0, 2 * r)]
    assert not replay(p2p_groups(programs))


def test_sends_that_nobody_receives_yet_deadlock_as_on_nccl():
    """NCCL's rule, which the CUDA send/recv inherits: every rank sending first to its
    neighbour, each send in its own group, waits forever (the CPU links buffer it instead)."""
    n = 3
    programs = [[("send", (r + 1) % n, 64), ("recv", (r - 1) % n, 64)] for r in range(n)]
    assert replay(p2p_groups(programs)) == [0, 1, 2]


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
