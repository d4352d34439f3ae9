"""tests/support/shared_launch.py on CPU: several checks in one launch of the ranks, each reported by
name; a failure, a hang or a crash in one check is named and does not spoil the checks before it
(nor, for a failure, after it)."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from shared_launch import Check, CheckFailed, launch_checks

SUPPORT = Path(__file__).resolve().parent / "support"


def _path():
    """PYTHONPATH for a pytest run in another folder: the tests' helpers importable."""
    return os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))


def _pid(rank, world):
    return os.getpid()


def _sum_of_ranks(rank, world):
    import torch

    t = torch.tensor([rank + 1])
    dist.all_reduce(t)  # the check's own default group
    return int(t)


def _fails_on_rank_1_after_a_communicator(rank, world):
    """Rank 0 goes on to create a second communicator that rank 1 never joins: both fail, and
    their rendezvous counters now disagree."""
    import ringcomm

    ringcomm.Communicator(timeout=10).close()
    assert rank != 1, "rank 1 fails here"
    ringcomm.Communicator(timeout=2)


def _ring_all_reduce(rank, world):
    import torch

    import ringcomm

    comm = ringcomm.Communicator(timeout=10)
    t = torch.full((1001,), float(rank + 1))
    comm.all_reduce(t)
    comm.close()
    return float(t[0])


def _hangs_on_rank_1(rank, world):
    if rank == 1:
        time.sleep(120)


def _crashes_on_rank_1(rank, world):
    if rank == 1:
        os._exit(3)


def test_checks_share_one_launch_and_fail_by_name(tmp_path):
    checks = [Check("pid", _pid), Check("sum", _sum_of_ranks),
              Check("fails", _fails_on_rank_1_after_a_communicator),
              Check("after", _ring_all_reduce), Check("pid again", _pid)]
    log = tmp_path / "launches.jsonl"
    outcomes = launch_checks(2, checks, 60, log=log)
    pids = outcomes["pid"].values()
    assert outcomes["pid again"].values() == pids, "one launch: the same processes throughout"
    assert outcomes["sum"].values() == [3, 3]
    with pytest.raises(CheckFailed) as failed:
        outcomes["fails"].values()
    message = str(failed.value)
    assert message.startswith("fails failed on rank 0 of 2 (ranks [1] failed too)"), message
    assert "CommTimeoutError" in message
    assert outcomes["after"].values() == [3.0, 3.0], "a failed check leaves nothing behind"
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    assert line["world"] == 2 and line["ended"] is None and not line["out_of_time"]
    assert line["start_up_s"] >= 0
    assert list(line["checks"]) == [c.name for c in checks]
    assert not line["checks"]["fails"]["passed"] and line["checks"]["after"]["passed"]


def test_a_check_still_running_at_the_deadline_is_cut_short_and_said_where():
    """Like a stage past its limit: the checks it did not reach, and the one it was in, skip as
    "cut short" (not failures: slow is not wrong), naming the rank and the check."""
    start = time.monotonic()
    outcomes = launch_checks(2, [Check("first", _pid), Check("hangs", _hangs_on_rank_1),
                                 Check("later", _pid)], 10)
    assert time.monotonic() - start < 20
    assert len(outcomes["first"].values()) == 2
    for name, expected in (("hangs", "cut short: hangs was not finished by ranks [1] of 2"),
                           ("later", "cut short: later was never reached: the launch ended "
                                     "(rank 1 was in hangs)")):
        with pytest.raises(pytest.skip.Exception) as skipped:
            outcomes[name].values()
        assert str(skipped.value).startswith(expected), str(skipped.value)
        assert "did not finish within 10" in str(skipped.value)


def test_a_crashed_rank_ends_the_launch_at_once():
    start = time.monotonic()
    outcomes = launch_checks(2, [Check("first", _pid), Check("crashes", _crashes_on_rank_1),
                                 Check("later", _pid)], 60)
    assert time.monotonic() - start < 20, "not a wait for the deadline"
    assert len(outcomes["first"].values()) == 2
    with pytest.raises(CheckFailed, match="rank 1 with code 3 of 2 exited without reporting"):
        outcomes["crashes"].values()
    with pytest.raises(CheckFailed, match="later was never reached.*rank 1 was in crashes"):
        outcomes["later"].values()


SESSION = '''
import os
import pytest
from shared_launch import SharedLaunches, on_ranks, shares_launch  # noqa: F401


@pytest.fixture(scope="session")
def shared_launches(request):
    return SharedLaunches(request.session)


def body(rank, world, offset, flavour="plain"):
    if flavour == "bad" and rank == 1:
        raise ValueError("rank 1 refuses")
    return (os.getpid(), rank + offset)


@shares_launch(body, 10)
@pytest.mark.parametrize("flavour", ["plain", "bad"])
@pytest.mark.parametrize("world", [2, 3])
def test_marked(world, flavour, on_ranks):
    values = on_ranks.values()
    assert [v[1] for v in values] == [10 + r for r in range(world)]


@shares_launch(body, 20, world=2)
def test_fixed_world(on_ranks):
    assert [v[1] for v in on_ranks.values()] == [20, 21]


@shares_launch(body, 30, world=2)
@pytest.mark.skip(reason="skipped: not in the launch")
def test_skipped(on_ranks):
    pass


def test_plain():
    pass
'''


@pytest.mark.system  # runs pytest itself
def test_pytest_tests_share_one_launch_per_world_size(tmp_path):
    """Through pytest: every marked test of the session at one world size shares one launch, in
    the session's order; a failing check fails its own test only, with the rank's traceback."""
    (tmp_path / "test_session.py").write_text(textwrap.dedent(SESSION))
    log = tmp_path / "launches.jsonl"
    env = {**os.environ, "PYTHONPATH": _path(),
           "RINGCOMM_TEST_LAUNCH_LOG": str(log)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rf", "test_session.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "2 failed, 4 passed, 1 skipped" in out, out
    assert "test_marked[2-bad]" in out and "test_marked[3-bad]" in out
    assert "failed on rank 1 of 2" in out and "ValueError: rank 1 refuses" in out
    launches = [json.loads(text) for text in log.read_text().splitlines()]
    assert sorted(line["world"] for line in launches) == [2, 3], "one launch per world size"
    two = next(line for line in launches if line["world"] == 2)
    assert [name.split("::")[1] for name in two["checks"]] == [
        "test_marked[2-plain]", "test_marked[2-bad]", "test_fixed_world"]


SLOW_SESSION = '''
import time
import pytest
from shared_launch import SharedLaunches, on_ranks, shares_launch  # noqa: F401


@pytest.fixture(scope="session")
def shared_launches(request):
    return SharedLaunches(request.session)


def slow(rank, world):
    time.sleep(60)


@shares_launch(slow, world=2)
def test_slow(on_ranks):
    on_ranks.values()
'''


@pytest.mark.system  # runs pytest itself
def test_the_callers_deadline_bounds_every_launch(tmp_path):
    """RINGCOMM_TEST_ENDS_AT (the GPU check's stage limit) wins over a launch's own budget, so
    the tests still report before the stage is cut: here as "cut short"."""
    (tmp_path / "test_slow.py").write_text(SLOW_SESSION)
    env = {**os.environ, "PYTHONPATH": _path(),
           "RINGCOMM_TEST_LAUNCH_TIMEOUT": "300", "RINGCOMM_TEST_ENDS_AT": str(time.time() + 12)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rs", "test_slow.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert time.monotonic() - start < 40, out
    assert "1 skipped" in out and "cut short: " in out, out
