"""The ring schedule, checked as data: a symbolic run of every rank's plan, with messages as
multisets of contributing ranks, proves each chunk is reduced by every rank exactly once and
that every rank ends with what it should -- for every collective, N = 1..64, awkward counts.
What a collective should do comes from its row of the C++ table (_C.COLLECTIVES: whether it
reduces, its root, its layout), so a new collective's plan is checked against its row."""
from collections import Counter, deque
from copy import copy

import pytest

import ringcomm
from ringcomm import _C, _testing
from ringcomm.options import ALGORITHM_COLLECTIVES, BETWEEN_HOSTS

COLLECTIVES_PLANNED = [kind.name for kind in _C.PLANNED_COLLECTIVES]  # point-to-point has no plan


def plans(collective, n, count, root, dtype=None):
    kind = _C.Collective.__members__[collective]
    c_dtype = None if dtype is None else getattr(_C.DataType, dtype)
    return [_C.make_plan(kind, r, n, count, root, c_dtype) for r in range(n)]


def initial(collective, rank, n, root):
    """Each rank's chunks before the collective: Counter of contributions, or a tag, or None."""
    info = _C.COLLECTIVES[collective]
    if info["reduces"]:
        return lambda chunk: Counter({rank: 1})
    if info["layout"] == "input_block":  # its block of what everyone ends with
        return lambda chunk: ("data", rank) if chunk in (rank, -1) else None
    if rank != root:
        return lambda chunk: None
    if info["layout"] == "in_place":  # the root's tensor
        return lambda chunk: ("data", root)
    return lambda chunk: ("block", chunk)  # output_block: the root holds every rank's block


def keys(plan):
    """The chunks a plan's steps name: -1 for a chain over the whole buffer (acks aside)."""
    if any(step["chunk"] == -1 and not step["ack"] for step in plan["steps"]):
        return {-1}
    return set(range(len(plan["chunks"])))


def simulate(collective, n, count, root=0, dtype=None):
    """Runs all plans over FIFO channels; returns each rank's final chunks (dict chunk -> value)."""
    all_plans = plans(collective, n, count, root, dtype)
    buffers = []
    for r, plan in enumerate(all_plans):
        start = initial(collective, r, n, root)
        buffers.append({c: start(c) for c in keys(plan)})
    channels = {(r, (r + 1) % n): deque() for r in range(n)}
    cursor = [0] * n
    progressed = True
    while progressed:
        progressed = False
        for r, plan in enumerate(all_plans):
            steps = plan["steps"]
            while cursor[r] < len(steps):
                step = steps[cursor[r]]
                chunk = step["chunk"]
                if step["ack"]:
                    assert step["count"] == 0 and not step["store"] and not step["reduce"]
                if step["recv_from"] >= 0:
                    assert step["recv_from"] == (r - 1) % n, "only ring neighbours talk"
                    channel = channels[(step["recv_from"], r)]
                    if not channel:
                        break
                    sent_chunk, value = channel.popleft()
                    assert sent_chunk == chunk, f"rank {r} expected chunk {chunk}, got {sent_chunk}"
                    assert (value == "ack") == step["ack"], f"rank {r}: ack and data crossed"
                    if step["reduce"]:
                        value = buffers[r][chunk] + value
                elif step["ack"]:
                    value = "ack"
                else:
                    value = buffers[r][chunk]
                assert value is not None, f"rank {r} sends chunk {chunk} it does not have"
                if step["store"]:
                    buffers[r][chunk] = value
                if step["send_to"] >= 0:
                    assert step["send_to"] == (r + 1) % n, "only ring neighbours talk"
                    channels[(r, step["send_to"])].append((chunk, value))
                if step["ack"] and step["recv_from"] >= 0:
                    value = None  # an ack carries nothing to keep
                cursor[r] += 1
                progressed = True
    stuck = [r for r in range(n) if cursor[r] < len(all_plans[r]["steps"])]
    assert not stuck, f"ranks {stuck} wait forever (deadlock in the plan)"
    assert all(not c for c in channels.values()), "messages left unreceived"
    return buffers, all_plans


def expected_final(collective, rank, n, root, chunks):
    """What rank `rank` must hold in `chunks` afterwards, from the collective's table row."""
    info = _C.COLLECTIVES[collective]
    everyone = Counter(range(n))
    # Reduce and gather deliver to their root only; a reduce leaves the others' tensors alone.
    to_root = info["root"] is not None and (info["reduces"] or info["layout"] == "input_block")
    if to_root and rank != root:
        return {c: Counter({rank: 1}) for c in chunks} if info["reduces"] else {}
    if info["layout"] == "output_block":  # this rank's block of the result
        return {rank: everyone if info["reduces"] else ("block", rank)}
    if info["reduces"]:
        return {c: everyone for c in chunks}
    if info["layout"] == "input_block":  # every rank's block
        return {c: ("data", c) for c in range(n)}
    return {c: ("data", root) for c in chunks}  # in place: the root's tensor


WORLD_SIZES = list(range(1, 17)) + [23, 31, 32, 64]


@pytest.mark.parametrize("collective", COLLECTIVES_PLANNED)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_every_rank_ends_with_the_right_chunks(collective, n):
    for root in sorted({0, n - 1, n // 2}):
        buffers, all_plans = simulate(collective, n, count=3 * n + 1, root=root)
        for r in range(n):
            for chunk, want in expected_final(collective, r, n, root, keys(all_plans[r])).items():
                assert buffers[r][chunk] == want, (collective, n, root, r, chunk)


def test_the_table_describes_each_collective():
    """The rows the symbolic runs above read their expectations from (a new collective's is
    checked by those runs alone)."""
    expected = {
        "all_reduce": (True, None, "in_place", True),
        "reduce_scatter": (True, None, "output_block", False),
        "all_gather": (False, None, "input_block", False),
        "broadcast": (False, "src", "in_place", False),
        "reduce": (True, "dst", "in_place", False),
        "gather": (False, "dst", "input_block", False),
        "scatter": (False, "src", "output_block", False)}
    for name, row in expected.items():
        info = _C.COLLECTIVES[name]
        assert (info["reduces"], info["root"], info["layout"], info["wire"]) == row, name
    assert list(_C.COLLECTIVES) == COLLECTIVES_PLANNED


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_allreduce_reduces_each_chunk_once_per_rank_and_finalizes_once(n):
    _, all_plans = simulate("all_reduce", n, count=n)
    for chunk in range(n):
        finalizers = [r for r, p in enumerate(all_plans) for s in p["steps"]
                      if s["chunk"] == chunk and s["finalize"]]
        assert finalizers == ([chunk] if n > 1 else []), "AVG divides once, by the chunk's owner"
    for p in all_plans:
        assert len(p["steps"]) == (2 * n - 1 if n > 1 else 0)


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 63, 64, 65, 1000, 1000003])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 64])
def test_allreduce_chunks_tile_the_buffer(n, count):
    plan = _C.make_plan(_C.Collective.all_reduce, 0, n, count)
    chunks = plan["chunks"]
    assert len(chunks) == n
    assert sum(c for _, c in chunks) == count
    assert all(chunks[i][0] + chunks[i][1] == chunks[i + 1][0] for i in range(n - 1))
    assert max(c for _, c in chunks) - min(c for _, c in chunks) <= 1


DTYPE_SIZES = {"int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "int64": 8, "float64": 8}
ALIGN_COUNTS = [0, 1, 2, 3, 5, 7, 15, 16, 17, 31, 63, 97, 1000, 4099, 65537, 1000003, 16 << 20]


@pytest.mark.parametrize("dtype", list(DTYPE_SIZES))
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 16])
def test_allreduce_chunks_start_on_16_byte_boundaries(n, dtype):
    """Kernels take the vector path only when a chunk starts at the same 16-byte phase in the
    caller's buffer and in a slot: so every chunk start is a multiple of 16 bytes."""
    size = DTYPE_SIZES[dtype]
    align = max(1, 16 // size)
    counts = ALIGN_COUNTS + [n - 1, n + 1, align * n - 1, align * n + 1]
    for count in counts:
        chunks = _C.make_plan(_C.Collective.all_reduce, 0, n, count, 0,
                              getattr(_C.DataType, dtype))["chunks"]
        assert len(chunks) == n
        assert chunks[0][0] == 0 and sum(c for _, c in chunks) == count
        assert all(chunks[i][0] + chunks[i][1] == chunks[i + 1][0] for i in range(n - 1))
        assert all(offset * size % 16 == 0 for offset, _ in chunks), (count, chunks)
        # Whole 16-byte groups spread evenly; only the last chunk holds the leftover elements.
        groups = [c // align for _, c in chunks[:-1]] + [(chunks[-1][1] - count % align) // align]
        assert all(c % align == 0 for _, c in chunks[:-1])
        assert max(groups) - min(groups) <= 1 and groups == sorted(groups, reverse=True)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_wire_allreduce_chunks_align_on_the_narrower_type(wire):
    """float32 data on a 16-bit wire: 16 bytes of the wire type are 8 elements, which are also
    32 bytes of the data: aligned in the buffer and in the slots."""
    chunks = _C.make_plan(_C.Collective.all_reduce, 0, 3, 1001, 0, _C.DataType.float32,
                          getattr(_C.DataType, wire))["chunks"]
    assert [o for o, _ in chunks] == [0, 336, 672] and chunks[-1][1] == 1001 - 672


def test_every_rank_gets_the_same_aligned_chunks():
    """The chunk table is the same on every rank (CPU and GPU communicators alike build it
    from the same request), or ranks would exchange different ranges."""
    for n, count in [(3, 1001), (8, 12345), (5, 7)]:
        tables = {tuple(map(tuple, _C.make_plan(_C.Collective.all_reduce, r, n, count, 0,
                                                 _C.DataType.bfloat16)["chunks"]))
                  for r in range(n)}
        assert len(tables) == 1


@pytest.mark.parametrize("dtype", list(DTYPE_SIZES))
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_aligned_allreduce_plans_still_reduce_every_chunk_once(n, dtype):
    """The symbolic run again, on the aligned plans (empty chunks included); every step works
    on exactly its chunk's range."""
    for count in (0, 1, n - 1, 7, 97, 4099):
        buffers, all_plans = simulate("all_reduce", n, count, dtype=dtype)
        assert all(buffers[r][c] == Counter(range(n)) for r in range(n) for c in range(n))
        for plan in all_plans:
            for step in plan["steps"]:
                assert (step["offset"], step["count"]) == tuple(plan["chunks"][step["chunk"]])


def test_column_count_covers_the_longest_chunk():
    prim = _C.Collective.all_reduce
    assert _testing.column_count(prim, 4, 0, 16) == 1  # empty collectives still exchange one message
    assert _testing.column_count(prim, 4, 65, 16) == 2  # chunks of 17 and 16 elements
    assert _testing.column_count(prim, 4, 64, 16) == 1


@pytest.mark.parametrize("collective", COLLECTIVES_PLANNED)
@pytest.mark.parametrize("n", [2, 3, 5, 16])
def test_every_rank_receives_at_least_once(collective, n):
    """So every rank checks its peer's collective header: mismatches fail everywhere, not only
    on the ranks that happen to receive."""
    for root in range(n):
        for plan in plans(collective, n, 5, root):
            assert any(s["recv_from"] >= 0 for s in plan["steps"])


def test_bad_requests_raise():
    with pytest.raises(ringcomm.RingcommError, match="outside the world"):
        _C.make_plan(_C.Collective.all_reduce, 4, 4, 10)
    with pytest.raises(ringcomm.RingcommError, match="root rank 5"):
        _C.make_plan(_C.Collective.broadcast, 0, 4, 10, 5)


def test_schedule_text_view():
    text = str(ringcomm.schedule("all_reduce", world_size=3, count=14))
    assert "all_reduce: 3 ranks, count 14" in text
    assert "c0=[0,4) c1=[4,8) c2=[8,14)" in text  # float32: chunks start 16 bytes apart
    int8 = ringcomm.schedule("all_reduce", world_size=2, count=40, dtype="int8").chunks
    assert int8 == ((0, 16), (16, 24))
    assert "c2 ->1" in text  # rank 0's first step sends chunk 2 to rank 1
    with pytest.raises(ValueError, match="no ring schedule for 'allreduce'"):
        ringcomm.schedule("allreduce")
    with pytest.raises(ValueError, match="no ring schedule for 'send_recv'"):
        ringcomm.schedule("send_recv")


# -- one-hop plans (one_shot, two_shot): publications instead of ring messages -----------------

# Plans between hosts (point-to-point messages to any rank, below) are not one-hop.
ONE_HOP = [(algorithm, collective) for algorithm, collectives in ALGORITHM_COLLECTIVES.items()
           if algorithm not in ("ring", "auto") + BETWEEN_HOSTS for collective in collectives]


def one_hop_plans(algorithm, collective, n, count, dtype=None):
    kind = _C.Collective.__members__[collective]
    c_dtype = None if dtype is None else getattr(_C.DataType, dtype)
    return [_C.make_plan(kind, r, n, count, 0, c_dtype, None, _C.Algorithm.__members__[algorithm])
            for r in range(n)]


def simulate_one_hop(algorithm, collective, n, count, dtype=None):
    """Runs every rank's plan against boards of publications; a read waits until its rank has
    published that phase. Reduced values are tuples of ranks in the order they were combined;
    gathered ones ("data", owner). Returns each rank's output chunks and the plans."""
    all_plans = one_hop_plans(algorithm, collective, n, count, dtype)
    keys = [-1] if len(all_plans[0]["chunks"]) == 1 else list(range(n))
    inputs, outputs = [], []
    for r in range(n):
        if collective == "all_gather":
            inputs.append({c: ("data", r) if c == r else None for c in keys})
        else:
            inputs.append({c: (r,) for c in keys})
        outputs.append(inputs[r] if collective != "reduce_scatter" else {})
    boards = {}  # (rank, phase) -> (published chunk, {chunk: value})
    cursor = [0] * n
    progressed = True
    while progressed:
        progressed = False
        for r, plan in enumerate(all_plans):
            while cursor[r] < len(plan["steps"]):
                step = plan["steps"][cursor[r]]
                chunk = step["chunk"]
                assert step["recv_from"] < 0 and step["send_to"] < 0 and not step["ack"]
                if step["read_from"] < 0:  # publish local data
                    assert step["publish_phase"] >= 0 and not step["store"]
                    covered = keys if chunk == -1 else [chunk]
                    value = {c: inputs[r][c] for c in covered}
                    assert None not in value.values(), f"rank {r} publishes what it lacks"
                    boards[r, step["publish_phase"]] = (chunk, value)
                else:
                    board = boards.get((step["read_from"], step["read_phase"]))
                    if board is None:
                        break
                    published, values = board
                    assert published == step["published_chunk"], (r, step)
                    value = values[chunk]
                    if step["reduce"]:
                        value = outputs[r][chunk] + value
                    if step["store"]:
                        outputs[r][chunk] = value
                    if step["publish_phase"] >= 0:
                        boards[r, step["publish_phase"]] = (chunk, {chunk: value})
                cursor[r] += 1
                progressed = True
    stuck = [r for r in range(n) if cursor[r] < len(all_plans[r]["steps"])]
    assert not stuck, f"ranks {stuck} wait forever for a publication"
    return outputs, all_plans


@pytest.mark.parametrize("algorithm,collective", ONE_HOP)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13])
def test_one_hop_plans_reduce_in_rank_order_and_end_right(algorithm, collective, n):
    for count in (0, 1, n - 1, 3 * n + 1):
        outputs, all_plans = simulate_one_hop(algorithm, collective, n, count, "float32")
        in_order = tuple(range(n))  # combined 0, 1, ..., N-1 on every rank: the same bits
        for r in range(n):
            if collective == "all_reduce":
                assert all(v == in_order for v in outputs[r].values()), (r, outputs[r])
            elif collective == "reduce_scatter":
                assert outputs[r] == {r: in_order}
            else:
                assert outputs[r] == {c: ("data", c) for c in range(n)}
        for r, plan in enumerate(all_plans):
            steps = plan["steps"]
            # Every round reads every rank's phase 0: what lets a board's two areas per phase
            # alternate without any barrier (Transport's publications).
            assert {s["read_from"] for s in steps if s["read_phase"] == 0 and s["read_from"] >= 0} \
                >= set(range(n)) - {r}
            finalizing = [s for s in steps if s["finalize"]]
            assert len(finalizing) == (0 if collective == "all_gather" else 1)


@pytest.mark.parametrize("n", [2, 3, 7])
def test_one_hop_plans_have_their_shapes(n):
    """one_shot all_reduce: one publication, N reads; two_shot: one more hop, chunked."""
    one = one_hop_plans("one_shot", "all_reduce", n, 100)[0]
    assert one["chunks"] == [(0, 100)] and len(one["steps"]) == n + 1
    two = one_hop_plans("two_shot", "all_reduce", n, 100, "float32")[1]
    assert len(two["chunks"]) == n and len(two["steps"]) == 1 + n + (n - 1)
    assert [s["publish_phase"] for s in two["steps"]].count(1) == 1
    with pytest.raises(ringcomm.RingcommError, match="two_shot has no plan for reduce_scatter"):
        one_hop_plans("two_shot", "reduce_scatter", n, 4)
    with pytest.raises(ringcomm.RingcommError, match="choose an algorithm"):
        _C.make_plan(_C.Collective.all_reduce, 0, n, 4, 0, None, None, _C.Algorithm.auto)


def test_one_hop_schedule_text_view():
    text = str(ringcomm.schedule("all_reduce", world_size=3, count=14, algorithm="two_shot"))
    assert "all_reduce: 3 ranks, count 14, two_shot" in text
    assert "all =>p0" in text and "c0 <=2:p0 + keep =>p1" in text and "c1 <=1:p1 keep" in text
    gather = ringcomm.schedule("all_gather", world_size=2, algorithm="one_shot")
    assert [s.describe() for s in gather.steps[0]] == ["c0 =>p0", "c1 <=1:p0 keep"]
    with pytest.raises(ValueError, match="no 'two_shot' schedule for 'all_gather'"):
        ringcomm.schedule("all_gather", algorithm="two_shot")


def test_steps_are_named_as_nccl_names_them():
    """all_reduce on 4 ranks: reduce-scatter (send, recvReduceSend x2, recvReduceCopySend), then
    allgather (recvCopySend x2, recv); chains close with an ack; one-hop plans publish and read."""
    plan = ringcomm.schedule("all_reduce", world_size=4, count=16)
    for steps in plan.steps:
        assert [s.kind for s in steps] == ["send", "recvReduceSend", "recvReduceSend",
                                           "recvReduceCopySend", "recvCopySend", "recvCopySend",
                                           "recv"]
    rs = ringcomm.schedule("reduce_scatter", world_size=3, count=4)
    assert [s.kind for s in rs.steps[0]] == ["send", "recvReduceSend", "recvReduceCopy"]
    chain = ringcomm.schedule("broadcast", world_size=3, count=4)
    assert {s.kind for steps in chain.steps for s in steps} >= {"send", "recvCopySend", "ack"}
    one_shot = ringcomm.schedule("all_reduce", world_size=3, count=4, algorithm="one_shot")
    assert [s.kind for s in one_shot.steps[0]] == ["publish", "read", "read", "read"]


# -- recursive_doubling: messages to any rank --------------------------------------------------

def simulate_point_to_point(algorithm, n, count, collective="all_reduce"):
    """Runs every rank's plan over FIFO channels between any two ranks, a send never waiting
    (TCP's slots). Values by block (-1: the whole tensor): multisets of the ranks combined, or
    ("data", owner). Returns each rank's final blocks, the number of messages each rank waited
    for in sequence (its depth), and the plans. A step names its blocks by its range: count >= 1
    outside all_reduce."""
    all_plans = one_hop_plans(algorithm, collective, n, count, "float32")
    value = [{b: initial(collective, r, n, 0)(b) for b in keys(all_plans[r])} for r in range(n)]
    channels = {}
    depth = [0] * n  # the longest chain of messages that reached each rank's current value
    cursor = [0] * n
    progressed = True
    while progressed:
        progressed = False
        for r, plan in enumerate(all_plans):
            while cursor[r] < len(plan["steps"]):
                step = plan["steps"][cursor[r]]
                assert step["read_from"] < 0 and not step["ack"]
                blocks = [-1] if step["chunk"] == -1 else list(
                    range(step["offset"] // count, (step["offset"] + step["count"]) // count))
                if step["recv_from"] >= 0:
                    channel = channels.get((step["recv_from"], r))
                    if not channel:
                        break
                    sent, got, hops = channel.popleft()
                    assert sent == blocks, (r, step, sent)  # the sender's blocks are these
                    depth[r] = max(depth[r], hops)
                    assert step["store"], (r, step)
                    for b, v in zip(blocks, got):
                        value[r][b] = value[r][b] + v if step["reduce"] else v
                else:
                    assert step["send_to"] >= 0 and step["send_to"] != r, (r, step)
                    assert all(value[r][b] is not None for b in blocks), (r, step)
                    channels.setdefault((r, step["send_to"]), deque()).append(
                        (blocks, [copy(value[r][b]) for b in blocks], depth[r] + 1))
                cursor[r] += 1
                progressed = True
    stuck = [r for r in range(n) if cursor[r] < len(all_plans[r]["steps"])]
    assert not stuck, f"ranks {stuck} wait forever (deadlock in the plan)"
    assert all(not c for c in channels.values()), "messages left unreceived"
    return value, depth, all_plans


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 23, 31, 32, 64])
def test_recursive_doubling_reduces_every_rank_once_in_log_depth(n):
    power = 1 << (n.bit_length() - 1)
    rounds = power.bit_length() - 1 + (2 if power < n else 0)
    for count in (0, 1, n - 1, 3 * n + 1):
        values, depth, all_plans = simulate_point_to_point("recursive_doubling", n, count)
        assert values == [{-1: Counter(range(n))}] * n
        # log2 of the power of two, and at most the fold and the unfold (a send overlaps them).
        assert power.bit_length() - 1 <= max(depth) <= rounds, depth
        for r, plan in enumerate(all_plans):
            finalizing = [s for s in plan["steps"] if s["finalize"]]
            # AVG divides once: at the last reduction of ranks below the power of two; ranks
            # above it receive the divided result.
            assert len(finalizing) == (1 if r < power else 0), (r, plan["steps"])
