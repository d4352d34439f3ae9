"""A job that loses a rank comes back: torchrun's restarts and stores that outlive their users.

Real torchrun (``python -m torch.distributed.run``) runs tests/support/restart_job.py with
``--max-restarts 1``; in attempt 0 rank 1 ends its process at step 3 (os._exit), torchrun stops
rank 0 and starts both again on the store it kept. Attempt 1 must train to the end with exactly
the expected weights, and no process of either attempt may leave anything in /dev/shm. Without
torchrun, two pairs of processes use one store the test keeps: the second pair has no attempt
number to tell it from the first, only the set-up epoch (ringcomm.world.epochs).

Every process a test starts is killed before it returns (torchrun starts its workers in
sessions of their own: they report their pids)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import restart_job
from shm_leaks import created_by, shm_entries
from subprocesses import Processes, checkout_env, free_port

JOB = Path(__file__).parent / "support" / "restart_job.py"
WORLD, STEPS, DIE = 2, 6, "0:1:3"  # attempt 0's rank 1 exits at step 3


@pytest.fixture
def processes(tmp_path):
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def result(out, attempt, rank):
    path = out / f"a{attempt}-r{rank}.json"
    return json.loads(path.read_text()) if path.exists() else None


def assert_trained_exactly(out, attempt, log):
    weight, bias = restart_job.expected_weights(WORLD, STEPS)
    for rank in range(WORLD):
        got = result(out, attempt, rank)
        assert got is not None and "error" not in got, (
            f"rank {rank} of attempt {attempt}: {got}\n{log.read_text()[-3000:]}")
        assert got["weight"] == weight and got["bias"] == bias, (rank, got, weight, bias)


def assert_nothing_left(processes):
    pids = processes.pids()
    assert len(pids) == 2 * WORLD, f"workers reported {pids}"  # attempt 0's and 1's
    assert created_by(shm_entries(), pids) == [], "a worker left shared memory in /dev/shm"


RENDEZVOUS = {
    "static": lambda port: ["--master-addr", "127.0.0.1", "--master-port", str(port)],
    "c10d": lambda port: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", "restart-test"],
}


@pytest.mark.system
@pytest.mark.parametrize("rendezvous,mode", [("static", "ddp"), ("c10d", "ddp"),
                                             ("static", "communicator")])
def test_torchrun_restart_trains_to_the_end(rendezvous, mode, tmp_path, processes):
    log = tmp_path / "torchrun.log"
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            *RENDEZVOUS[rendezvous](free_port()),
            str(JOB), "--mode", mode, "--out", str(tmp_path), "--steps", str(STEPS),
            "--die", DIE]
    with open(log, "w") as out:
        run = processes.start(args, checkout_env(), out)
        try:
            code = run.wait(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun still running after 240 s:\n{log.read_text()[-3000:]}")
    assert code == 0, f"torchrun exited with {code}:\n{log.read_text()[-3000:]}"
    assert result(tmp_path, 0, 1) is None  # the rank that died wrote nothing
    assert_trained_exactly(tmp_path, 1, log)
    assert_nothing_left(processes)


def test_a_second_group_on_a_store_that_outlived_the_first(tmp_path, processes):
    """No torchrun, so no attempt number: two groups of processes, one after the other, build
    communicators on one store; the first loses rank 1 at step 3. The second group's keys are
    the first's but for the epoch its ranks agree on, and it trains exactly."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {k: v for k, v in checkout_env().items() if not k.startswith("TORCHELASTIC_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(WORLD))
    log = tmp_path / "groups.log"
    with open(log, "w") as out:
        for attempt in (0, 1):
            group = [processes.start([sys.executable, str(JOB), "--mode", "communicator",
                                      "--out", str(tmp_path), "--steps", str(STEPS),
                                      "--die", DIE, "--attempt", str(attempt)],
                                     dict(env, RANK=str(rank)), out)
                     for rank in range(WORLD)]
            codes = [p.wait(timeout=120) for p in group]
            assert codes == ([1, 3] if attempt == 0 else [0, 0]), (codes, log.read_text())
    survivor = result(tmp_path, 0, 0)["error"]
    assert "PeerError" in survivor and "rank 1" in survivor, survivor
    assert_trained_exactly(tmp_path, 1, log)
    assert_nothing_left(processes)


def test_the_ddp_survivor_of_a_lost_rank_raises_naming_it(tmp_path, processes):
    """What attempt 0's rank 0 meets when rank 1 dies (torchrun usually stops it first): its
    backward raises an error naming rank 1, instead of crashing in DDP's reducer."""
    env = {k: v for k, v in checkout_env().items() if not k.startswith("TORCHELASTIC_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD))
    log = tmp_path / "pair.log"
    with open(log, "w") as out:
        pair = [processes.start([sys.executable, str(JOB), "--mode", "ddp", "--out",
                                 str(tmp_path), "--steps", str(STEPS), "--die", DIE,
                                 "--attempt", "0"], dict(env, RANK=str(rank)), out)
                for rank in range(WORLD)]
        codes = [p.wait(timeout=120) for p in pair]
    assert codes == [1, 3], (codes, log.read_text()[-3000:])
    survivor = result(tmp_path, 0, 0)["error"]
    assert "PeerError" in survivor and "rank 1" in survivor and "died" in survivor, survivor
