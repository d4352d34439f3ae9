"""Set-up errors say what happened: a peer that never came, one whose place only a dead
process asked for (a stale peer, e.g. of an earlier attempt of the job), ranks that do not see
the same shared memory (two hosts, then). Each rank is a real process on a store the test keeps."""
import shutil
import subprocess
import sys

import pytest
import torch.distributed as dist

from subprocesses import checkout_env

# Prints what the rank's set-up raised and exits with 7; exits 0 if set-up worked.
RANK = """
import sys, torch.distributed as dist, ringcomm
store = dist.TCPStore('127.0.0.1', {port}, is_master=False)
try:
    ringcomm.Communicator.from_store(store, {rank}, 2, timeout={timeout}).close()
except ringcomm.RingcommError as error:
    print(type(error).__name__, error)
    sys.exit(7)
"""


def rank_command(port, rank, timeout):
    # -P: the working folder (a source checkout, maybe unbuilt) must not shadow the ringcomm
    # this test imported, which checkout_env puts on the path.
    return [sys.executable, "-P", "-c", RANK.format(port=port, rank=rank, timeout=timeout)]


def run_alone(port, rank, timeout=2):
    return subprocess.run(rank_command(port, rank, timeout), env=checkout_env(), timeout=120,
                          capture_output=True, text=True)


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_a_missing_and_a_stale_peer_are_named(store):
    # Rank 1 asks to join, waits for a rank 0 that never comes, and exits: its request stays.
    alone = run_alone(store.port, 1)
    assert alone.returncode == 7, alone.stdout + alone.stderr
    assert "CommTimeoutError" in alone.stdout and "waiting for rank 0" in alone.stdout
    assert "missing peer" in alone.stdout, alone.stdout
    # Rank 0 then finds only that request for rank 1's place, made by a process that is gone.
    leader = run_alone(store.port, 0)
    assert leader.returncode == 7, leader.stdout + leader.stderr
    message = leader.stdout
    assert "rank 1" in message and "which has exited" in message, message
    assert "stale peer" in message and "earlier attempt" in message, message
    # A full set-up on the same keys afterwards works: nothing stale is used.
    pair = [subprocess.Popen(rank_command(store.port, r, 60), env=checkout_env(),
                             stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in pair]
    finally:
        for p in pair:
            p.kill()
    assert [p.returncode for p in pair] == [0, 0], outputs


@pytest.mark.system
def test_ranks_that_see_different_shared_memory_are_joined_over_the_network(store):
    """Rank 1 runs in a mount namespace with its own /dev/shm (as on another host): set-up
    finds two hosts and links them over TCP instead of failing to map rank 0's segments."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a mount namespace here (needs root)")
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"']
    pair = [subprocess.Popen(command, env=checkout_env(), stdout=subprocess.PIPE, text=True)
            for command in (rank_command(store.port, 0, 60),
                            private + rank_command(store.port, 1, 60))]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in pair]
    finally:
        for p in pair:
            p.kill()
    assert [p.returncode for p in pair] == [0, 0], outputs
