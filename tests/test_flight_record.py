"""The flight record: each communicator keeps its last calls (what, how far, how they ended),
readable at any time, and an error ends with this rank's last few. Real processes."""
import pytest
import torch

from launcher import die_soon, launch


def recorded(rank, n):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60, trace_buffer=3)
    comm.all_reduce(torch.ones(1000))
    comm.all_gather(torch.empty(2 * n), torch.ones(2))
    if rank == 0:
        comm.send(torch.ones(3), dst=1)
    else:
        comm.recv(torch.empty(3), src=0)
    comm.broadcast(torch.ones(5), src=0)
    record = comm.flight_record()
    comm.close()
    return record


def test_the_record_keeps_the_last_calls_in_order_with_their_steps():
    for rank, record in enumerate(launch(2, recorded)):
        assert [e["name"] for e in record] == ["all_gather", "send" if rank == 0 else "recv",
                                               "broadcast"], record  # 3 kept
        assert [e["call"] for e in record] == [1, 2, 3]
        assert all(e["state"] == "completed" and e["ended"] >= e["started"] > 0 for e in record)
        assert record[0]["sequence"] == 1 and record[1]["sequence"] is None
        assert record[0]["steps"] > 0 and record[0]["step"] == record[0]["steps"] - 1


def mismatched(rank, n):
    import ringcomm

    comm = ringcomm.Communicator(timeout=30)
    comm.all_reduce(torch.ones(10))
    with pytest.raises(ringcomm.MismatchError) as error:
        comm.all_reduce(torch.ones(100 if rank == 0 else 200))
    record = comm.flight_record()
    comm.close()
    return str(error.value), record


def test_an_error_ends_with_the_last_calls_and_the_record_says_where_it_failed():
    for message, record in launch(2, mismatched):
        assert "this rank's last calls:" in message, message
        assert "all_reduce #0 float32 x10 sum one_shot: completed" in message, message
        assert "all_reduce #1 float32 x" in message and ": failed at step" in message, message
        assert [e["state"] for e in record] == ["completed", "failed"]
        assert "mismatch" in record[-1]["failure"]


def killed(rank, n):
    import ringcomm
    import torch.distributed as dist

    comm = ringcomm.Communicator(timeout=30)
    big = torch.ones(1 << 20)
    comm.all_reduce(big)
    if rank == 1:
        die_soon(dist.distributed_c10d._get_default_store())
    with pytest.raises(ringcomm.PeerError):
        for _ in range(10000):
            comm.all_reduce(big)
    return comm.flight_record()[-1]


def test_a_dead_peer_leaves_the_step_it_stopped_at():
    last = launch(2, killed, allow_exit={1})[0]
    assert last["name"] == "all_reduce" and last["state"] == "failed", last
    assert 0 <= last["step"] < last["steps"] and "rank 1" in last["failure"], last


def nothing_kept(rank, n):
    import ringcomm

    comm = ringcomm.Communicator(timeout=30, trace_buffer=0)
    comm.all_reduce(torch.ones(4))
    record = comm.flight_record()
    comm.close()
    return record


def test_a_trace_buffer_of_0_keeps_nothing():
    assert launch(2, nothing_kept) == [[], []]


def queued_calls(rank, n):
    import time

    import ringcomm

    comm = ringcomm.Communicator(timeout=30)
    tensors = [torch.ones(10) for _ in range(3)]
    if rank == 1:
        time.sleep(1.0)  # rank 0's first call waits for this rank; its next two stay queued
    works = [comm.all_reduce(t, async_op=True) for t in tensors]
    while_waiting = comm.flight_record()
    for w in works:
        w.wait()
    after = comm.flight_record()
    comm.close()
    return while_waiting, after


def test_asynchronous_calls_not_yet_started_show_as_queued():
    while_waiting, after = launch(2, queued_calls)[0]
    queued = [e for e in while_waiting if e["state"] == "queued"]
    assert [e["name"] for e in queued] == ["all_reduce", "all_reduce"], while_waiting
    assert all(e["started"] > 0 and e["backend"] == "queue" for e in queued)
    assert [e["state"] for e in after] == ["completed"] * 3, after
