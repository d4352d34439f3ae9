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
    """Ranks sharing one GPU: NCCL >= 2.30.3 is asked to allow it; older NCCL (2.30.0-2.30.2
    included, which lack the switch) sees each rank as its own host (a different NCCL_HOSTID),
    talking over loopback."""
    from ringcomm.cuda_backend import shared_gpu_env

    assert shared_gpu_env(3, nccl_version=23003) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    assert shared_gpu_env(3, nccl_version=23200) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    for version in (22809, 23000, 23002):
        old = [shared_gpu_env(r, nccl_version=version) for r in range(2)]
        assert all(env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_IB_DISABLE"] == "1"
                   for env in old)
        assert old[0]["NCCL_HOSTID"] != old[1]["NCCL_HOSTID"]
        assert "NCCL_MULTI_RANK_GPU_ENABLE" not in old[0]


def test_shared_gpu_env_asks_the_nccl_ringcomm_loads():
    from launcher import shared_gpu_env as test_env
    from ringcomm.cuda_backend import MULTI_RANK_GPU_NCCL, nccl_library_hint

    if not _C.build_info()["cuda"]:
        pytest.skip("ringcomm was built without CUDA (no nvcc at build time)")
    try:
        version = _C.nccl_library(nccl_library_hint())[1]
    except _C.RingcommError as error:
        pytest.skip(f"NCCL's library (libnccl.so.2) could not be loaded: {str(error).splitlines()[0]}")
    env = test_env(0)
    assert env["NCCL_MAX_CTAS"]
    expected = ({"NCCL_MULTI_RANK_GPU_ENABLE"} if version >= MULTI_RANK_GPU_NCCL else
                {"NCCL_HOSTID", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"})
    assert set(env) - {"NCCL_MAX_CTAS"} == expected


# -- publications (one-hop algorithms) on NCCL, replayed with their data ---------------------------

PUBLISH_BYTES = 4096


def publication_traces(programs, publish_bytes=PUBLISH_BYTES, slots=4, slot_bytes=256):
    """Every rank's (events, staging bytes) for its program of ("publish", phase, bytes),
    ("read", peer, phase, bytes), ("send"/"recv", peer, bytes) and ("end",)."""
    return [_C.testing.trace_nccl_publications(r, len(programs), program, slots, slot_bytes,
                                               publish_bytes)
            for r, program in enumerate(programs)]


def replay_flow(ranks):
    """replay()'s NCCL semantics on every rank's events, following the data: a write tags the
    rank's own area with (rank, round, phase); a send and its receive, once both their groups
    run, copy the sender's tag into the receiver's area; a read must find the tag of the rank,
    round and phase it asked for (unless it reads no bytes). Returns the ranks left stuck."""
    n = len(ranks)
    counts = {}
    numbered = []
    for r, events in enumerate(ranks):
        mine = []
        for event in events:
            if event[0] == "group":
                ops = []
                for kind, peer, size, _, _, area in event[1]:
                    if size == 0:
                        continue
                    key = (r, peer) if kind == "send" else (peer, r)
                    counts[(kind, key)] = counts.get((kind, key), 0) + 1
                    ops.append((kind, key, counts[(kind, key)] - 1, size, area))
                event = ("group", ops)
            mine.append(event)
        numbered.append(mine)
    areas = [{} for _ in range(n)]
    head = [0] * n
    done = [set() for _ in range(n)]
    progressed = True
    while progressed:
        progressed = False
        for r in range(n):
            while head[r] < len(numbered[r]) and numbered[r][head[r]][0] != "group":
                event = numbered[r][head[r]]
                if event[0] == "write":
                    _, area, round_, phase, _ = event
                    areas[r][area] = (r, round_, phase)
                else:  # a zero-byte read reads nothing
                    _, area, peer, round_, phase, size = event
                    assert not size or areas[r].get(area) == (peer, round_, phase), (
                        f"rank {r} read area {area} for rank {peer}'s round {round_} phase "
                        f"{phase} and found {areas[r].get(area)}")
                head[r] += 1
                progressed = True
        running = {}
        for r in range(n):
            if head[r] < len(numbered[r]):
                for i, (kind, key, k, size, area) in enumerate(numbered[r][head[r]][1]):
                    running[(kind, key, k)] = (r, i, size, area)
        for (kind, key, k), (r, i, size, area) in running.items():
            if kind != "send" or i in done[r]:
                continue
            partner = running.get(("recv", key, k))
            if partner is not None:
                pr, pi, psize, parea = partner
                assert psize == size, f"message {k} of {key}: {size} bytes sent, {psize} expected"
                if area >= 0:
                    areas[pr][parea] = areas[r].get(area)
                done[r].add(i)
                done[pr].add(pi)
                progressed = True
        for r in range(n):
            if (head[r] < len(numbered[r]) and numbered[r][head[r]][0] == "group"
                    and len(done[r]) == len(numbered[r][head[r]][1])):
                head[r] += 1
                done[r] = set()
                progressed = True
    return [r for r in range(n) if head[r] < len(numbered[r])]


def _read_order(rank, n, style, rng):
    if style == "rank order":  # one_shot's: ((x0 op x1) op x2) ...
        return list(range(n))
    if style == "self first":
        return [(rank + i) % n for i in range(n)]
    if style == "reversed":
        return list(reversed(range(n)))
    order = list(range(n))
    rng.shuffle(order)
    return order


# (phase-0 bytes, phase-1 bytes or None): one_shot rounds publish once, two_shot rounds twice;
# zero-byte rounds (count 0) and the largest publication included.
ROUNDS = [(40, None), (PUBLISH_BYTES, 16), (0, None), (8, 8), (1000, None), (24, 0), (4, 4)]


def _one_hop_programs(n, seed, prelude=False):
    """Every rank publishes and reads every rank's publication of each phase, round by round,
    in its own order (ranks may differ); a collective ends after each round."""
    programs = []
    for r in range(n):
        rng = random.Random(seed * 100 + r)
        program = []
        if prelude:  # a ring collective first: its messages go through the same queue
            program += [("send", (r + 1) % n, 64), ("recv", (r - 1) % n, 64), ("end",)]
        for k, (first, second) in enumerate(ROUNDS):
            style = ["rank order", "self first", "reversed", "random"][(k + seed + r) % 4]
            for phase, size in enumerate((first, second)):
                if size is None:
                    continue
                program.append(("publish", phase, size))
                program += [("read", p, phase, size) for p in _read_order(r, n, style, rng)]
            program.append(("end",))
        programs.append(program)
    return programs


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_publications_match_up_and_carry_the_right_round_and_phase(n):
    for seed in range(3):
        traces = publication_traces(_one_hop_programs(n, seed, prelude=seed == 1))
        assert not replay_flow([events for events, _ in traces]), (n, seed)
        for r, (events, staging) in enumerate(traces):
            groups = [e[1] for e in events if e[0] == "group" and e[1][0][5] >= 0]
            sizes = [s for first, second in ROUNDS for s in (first, second) if s]
            # One group per phase that carries bytes: n-1 sends of this rank's publication and
            # n-1 receives, one each way with every peer, all of the phase's size.
            assert [g[0][2] for g in groups] == sizes
            for g in groups:
                sends = [op for op in g if op[0] == "send"]
                recvs = [op for op in g if op[0] == "recv"]
                peers = sorted(set(range(n)) - {r})
                assert sorted(op[1] for op in sends) == peers == sorted(op[1] for op in recvs)
                assert len({op[2] for op in g}) == 1 and len({op[5] for op in sends}) == 1
                assert len({op[5] for op in recvs}) == n - 1  # a copy per peer
            # Areas: aligned, inside the staging buffer, never overlapping.
            used = sorted({op[5] for g in groups for op in g})
            assert all(a % 256 == 0 and a + PUBLISH_BYTES <= staging for a in used)
            assert all(b - a >= PUBLISH_BYTES for a, b in zip(used, used[1:]))
            assert staging == (2 * n + 2) * PUBLISH_BYTES


def _balanced(count, n):
    return [count // n + (1 if i < count % n else 0) for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_uneven_publications_with_declared_sizes(n):
    """two_shot's shape: phase 0 the whole input, phase 1 this rank's chunk of uneven size
    (fewer elements than ranks included), every rank's size declared before the phase's first
    read; each receive is posted with its sender's size, and zero-byte ones are left out."""
    counts = [1, n - 1, 1000, 12345, 0, 2 * n + 1]
    programs = []
    for r in range(n):
        program = []
        for count in counts:
            chunks = [4 * c for c in _balanced(count, n)]
            program.append(("publish", 0, 4 * count))
            program += [("read", p, 0, 4 * count) for p in range(n)]
            # (this rank's own entry is not used: two_shot reads no chunk of its own)
            declared = [c if p != r or r % 2 == 0 else 0 for p, c in enumerate(chunks)]
            program += [("publish", 1, chunks[r]), ("expect", 1, declared)]
            program += [("read", (r + i) % n, 1, chunks[(r + i) % n]) for i in range(n)]
            program.append(("end",))
        programs.append(program)
    traces = publication_traces(programs, publish_bytes=4 * 12345)
    assert not replay_flow([events for events, _ in traces])
    for r, (events, _) in enumerate(traces):
        after_phase_one = [events[i + 1] for i, e in enumerate(events)
                           if e[0] == "write" and e[3] == 1]
        for count, event in zip(counts, after_phase_one):
            chunks = [4 * c for c in _balanced(count, n)]
            want = sorted([("send", p, chunks[r]) for p in range(n) if p != r and chunks[r]]
                          + [("recv", p, chunks[p]) for p in range(n) if p != r and chunks[p]])
            got = sorted(op[:3] for op in event[1]) if event[0] == "group" else []
            assert got == want, (r, count)


ONE_HOP = [name for name in ("one_shot", "two_shot") if name in _C.Algorithm.__members__]


@pytest.mark.parametrize("algorithm", ONE_HOP)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_one_hop_plans_on_nccl(algorithm, n):
    """The core's real one-hop plans and executor through NcclTransport's bookkeeping, for every
    collective the algorithm plans, awkward counts (two_shot's uneven chunks: every rank's size
    declared before a phase's first read), publications small enough for many rounds,
    replayed with their data."""
    ran = 0
    for primitive in ("all_reduce", "reduce_scatter", "all_gather"):
        for count in (0, 1, n - 1, 7, 1000, 12345):
            for publish_bytes in (256, 4096):
                try:
                    ranks = [_C.testing.trace_nccl_plan(
                        _C.Primitive.__members__[primitive], r, n, count,
                        _C.Algorithm.__members__[algorithm], _C.DataType.float32, 4, 4096,
                        publish_bytes) for r in range(n)]
                except _C.MismatchError:
                    raise
                except _C.RingcommError as e:
                    if "plan" in str(e) and primitive != "all_reduce":
                        break  # not planned for this collective
                    raise
                assert not replay_flow(ranks), (primitive, count, publish_bytes)
                ran += 1
    assert ran


def test_own_publications_alternate_by_round_parity():
    """A round may still read its own area while the next one's is written: own areas of
    consecutive rounds differ, rounds two apart share one."""
    n = 3
    events, _ = publication_traces(_one_hop_programs(n, 0))[1]
    writes = [(e[2], e[3], e[1]) for e in events if e[0] == "write"]  # (round, phase, area)
    area = {(k, phase): a for k, phase, a in writes}
    for k, phase, a in writes:
        if (k + 1, phase) in area:
            assert area[(k + 1, phase)] != a
        if (k + 2, phase) in area:
            assert area[(k + 2, phase)] == a


def test_flow_replay_catches_wrong_data_and_missing_exchanges():
    """The checker itself: a receive into the wrong peer's area is caught at the read, and a
    rank that skips a round leaves its peers waiting."""
    n = 3
    traces = [events for events, _ in publication_traces(_one_hop_programs(n, 0))]
    first = next(i for i, e in enumerate(traces[0]) if e[0] == "group")
    ops = traces[0][first][1]
    recvs = [i for i, op in enumerate(ops) if op[0] == "recv"]
    a, b = ops[recvs[0]], ops[recvs[1]]
    ops[recvs[0]], ops[recvs[1]] = a[:5] + (b[5],), b[:5] + (a[5],)
    with pytest.raises(AssertionError, match="rank 0 read area"):
        replay_flow(traces)

    short = [p if r else p[:-len(p) // 2] for r, p in enumerate(_one_hop_programs(n, 0))]
    assert replay_flow([events for events, _ in publication_traces(short)])


@pytest.mark.parametrize("program,error", [
    ([("read", 1, 0, 8)], "before this rank published it"),
    ([("publish", 0, 8), ("read", 1, 0, 16)], "without declared sizes"),
    ([("publish", 0, 8), ("expect", 0, [8, 16]), ("read", 1, 0, 8)], "the declared size differs"),
    ([("publish", 0, 8), ("expect", 0, [8])], "for 1 ranks in a world of 2"),
    ([("publish", 0, 8), ("expect", 0, [8, PUBLISH_BYTES + 1])], "exceeds"),
    ([("expect", 0, [8, 8])], "declared in a round"),
    ([("publish", 0, 8), ("read", 1, 0, 8), ("expect", 0, [8, 8])], "before its first read"),
    ([("publish", 0, 8), ("read", 0, 0, 16)], "own publication of phase 0"),
    ([("publish", 0, PUBLISH_BYTES + 1)], "exceeds"),
    ([("publish", 1, 8)], "after phase 0"),
    ([("publish", 0, 8), ("read", 1, 0, 8), ("publish", 1, 8)], "never read"),
    ([("publish", 0, 8), ("end",)], "never read"),
    ([("publish", 2, 8)], "phase 2"),
    ([("read", 5, 0, 8)], "outside the world"),
])
def test_publication_misuse_is_refused(program, error):
    """What the bookkeeping refuses before NCCL could hang on it (a size no peer sends, a
    publication nobody receives)."""
    with pytest.raises(_C.RingcommError, match=error):
        _C.testing.trace_nccl_publications(0, 2, program, 4, 256, PUBLISH_BYTES)


def test_no_publications_without_room():
    with pytest.raises(_C.RingcommError, match="no publications"):
        _C.testing.trace_nccl_publications(0, 2, [("publish", 0, 8)], 4, 256, 0)
