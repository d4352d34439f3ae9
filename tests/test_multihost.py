"""ringcomm across hosts: emulated hosts on one machine (tools/emulated_hosts.py: each its own
network, /dev/shm and hostname), ranks started by torchrun on every host, the CPU path over
shared memory inside a host and TCP between hosts. Needs root; skipped elsewhere."""
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import emulated_hosts  # noqa: E402
from emulated_hosts import EmulatedHosts  # noqa: E402
from subprocesses import checkout_env  # noqa: E402

OK, WHY = emulated_hosts.available()
pytestmark = [pytest.mark.system, pytest.mark.skipif(not OK, reason=WHY)]
JOB = str(ROOT / "tests" / "support" / "multihost_job.py")
# The ringcomm this test imports (installed, or this checkout built in place), for the ranks.
ENV = {"PYTHONPATH": checkout_env()["PYTHONPATH"]}


def results(outputs):
    """Every rank's RESULT, by rank; fails showing every host's output if a host failed."""
    assert all(rc == 0 for rc, _, _ in outputs), emulated_hosts.format_outputs(outputs)
    found = [json.loads(line.split(" ", 1)[1]) for _, out, _ in outputs
             for line in out.splitlines() if line.startswith("RESULT ")]
    return {r["rank"]: r for r in found}


@pytest.mark.parametrize("count,per_host", [(2, 2), (3, 1)])
def test_every_collective_is_exact_across_hosts(count, per_host):
    with EmulatedHosts(count) as hosts:
        by_rank = results(hosts.torchrun([JOB, "sweep"], per_host, env=ENV, timeout=600))
        leftovers = [hosts.shm_files(h) for h in range(count)]
    world = count * per_host
    assert sorted(by_rank) == list(range(world))
    for rank, r in by_rank.items():
        assert r["host"] == f"host{rank // per_host}"
        assert r["cases"] > 300 and not r["failures"], r["failures"][:10]
    assert leftovers == [[]] * count  # nothing of ours stays in any host's /dev/shm
    if per_host == 2:
        # In two levels each rank sends its host peer (rank ^ 1) and its ring peer on the other
        # host ((rank + 2) % 4) only, and the network its share: for a 256 KiB all_reduce, half
        # the data in the reduce-scatter and its 128 KiB shard in the all-gather inside the
        # host, the shard's ring traffic (2(H-1)/H of 128 KiB) between hosts (a flat ring would
        # send 384 KiB to its successor); for reduce_scatter and all_gather of 64 KiB blocks,
        # two groups of 2 blocks inside the host (half of them), one block between hosts.
        expected = {"all_reduce": (256, 128), "reduce_scatter": (128, 64),
                    "all_gather": (128, 64)}
        for rank, r in by_rank.items():
            peer, across = rank ^ 1, (rank + 2) % 4
            for name, (to_peer, to_across) in expected.items():
                sent = r["bytes_sent"][name]
                assert (sent[peer], sent[across]) == (to_peer * 1024, to_across * 1024), (name, sent)
                assert sent[rank] == sent[across ^ 1] == 0, (name, sent)


@pytest.mark.parametrize("count,per_host", [(2, 1), (3, 1), (4, 1), (8, 1), (2, 2), (3, 2)])
def test_recursive_doubling_between_hosts_is_exact(count, per_host):
    """recursive_doubling (between hosts: of every rank at one rank per host, of the hosts'
    leaders per local index in two levels), power-of-two host counts and not."""
    with EmulatedHosts(count) as hosts:
        by_rank = results(hosts.torchrun([JOB, "doubling"], per_host, env=ENV, timeout=900))
        leftovers = [hosts.shm_files(h) for h in range(count)]
    assert sorted(by_rank) == list(range(count * per_host))
    for r in by_rank.values():
        assert r["cases"] > 100 and not r["failures"], r["failures"][:10]
    assert leftovers == [[]] * count


def test_uneven_hosts_all_reduce_through_their_leaders_exactly():
    """3 ranks on one host, 1 on the other: every collective exact, and all_reduce in two
    levels (only the hosts' first ranks, 0 and 3, talk across hosts), not on the flat ring
    (where rank 2 would send to rank 3)."""
    with EmulatedHosts(2) as hosts:
        by_rank = results(hosts.torchrun([JOB, "sweep"], [3, 1], env=ENV, timeout=900))
        leftovers = [hosts.shm_files(h) for h in range(2)]
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, r in by_rank.items():
        assert r["host"] == ("host0" if rank < 3 else "host1")
        assert r["cases"] > 300 and not r["failures"], r["failures"][:10]
        sent = r["bytes_sent"]["all_reduce"]
        across = [q for q in range(4) if sent[q] and (q < 3) != (rank < 3)]
        assert across == ([3] if rank == 0 else [0] if rank == 3 else []), (rank, sent)
        if rank == 0:  # the leader sends the whole 256 KiB tensor's 2(H-1)/H once between hosts
            assert sent[3] == 256 * 1024, sent
        # Through the leaders, reduce_scatter and all_gather would send as many bytes between
        # hosts as the flat ring (3 of 4 blocks): the flat ring runs them (rank 2 sends to 3).
        for name in ("reduce_scatter", "all_gather"):
            assert bool(r["bytes_sent"][name][3]) == (rank == 2), (rank, name, r["bytes_sent"])
    assert leftovers == [[], []]


@pytest.mark.parametrize("per_host,forced", [((3, 1), "on"), ((1, 3), "on"), ((2, 1, 1), "on"),
                                              ((3, 2), "")], ids=["3_1", "1_3", "2_1_1", "3_2"])
def test_uneven_hosts_reduce_scatter_and_all_gather_through_their_leaders_exactly(
        per_host, forced):
    """reduce_scatter and all_gather taken through the hosts' leaders (forced, or on 3+2 by
    bytes: 3 blocks between hosts against the flat ring's 4): exact in and out of place for
    every op at awkward counts and in several pieces, and only the leaders (each host's first
    rank) send between hosts."""
    env = dict(ENV, RINGCOMM_UNEVEN_LEADERS=forced)
    with EmulatedHosts(len(per_host)) as hosts:
        by_rank = results(hosts.torchrun([JOB, "blocks"], list(per_host), env=env, timeout=900))
        leftovers = [hosts.shm_files(h) for h in range(len(per_host))]
    world = sum(per_host)
    host_of = [h for h, ranks in enumerate(per_host) for _ in range(ranks)]
    leaders = [host_of.index(h) for h in range(len(per_host))]
    assert sorted(by_rank) == list(range(world))
    for rank, r in by_rank.items():
        assert r["host"] == f"host{host_of[rank]}"
        assert r["cases"] > 100 and not r["failures"], r["failures"][:10]
        for name, sent in r["bytes_sent"].items():
            across = [q for q in range(world) if sent[q] and host_of[q] != host_of[rank]]
            assert set(across) <= set(leaders) and (not across or rank in leaders), (
                rank, name, sent)
            if rank in leaders:  # its host's blocks, padded to the largest host's, (H-1) times
                padded = (len(per_host) - 1) * max(per_host) * 64 * 1024
                assert sum(sent[q] for q in across) == padded, (rank, name, sent)
    assert leftovers == [[]] * len(per_host)


@pytest.mark.parametrize("per_host", [(2, 1, 1), (1, 3)], ids=["2_1_1", "1_3"])
def test_uneven_hosts_recursive_doubling_between_their_leaders_is_exact(per_host):
    env = dict(ENV, RINGCOMM_UNEVEN_LEADERS="on")
    with EmulatedHosts(len(per_host)) as hosts:
        by_rank = results(hosts.torchrun([JOB, "doubling"], list(per_host), env=env, timeout=900))
        leftovers = [hosts.shm_files(h) for h in range(len(per_host))]
    assert sorted(by_rank) == list(range(sum(per_host)))
    for r in by_rank.values():
        assert r["cases"] > 100 and not r["failures"], r["failures"][:10]
    assert leftovers == [[]] * len(per_host)


def test_ddp_trains_on_the_ringcomm_backend_across_hosts():
    with EmulatedHosts(2) as hosts:
        by_rank = results(hosts.torchrun([JOB, "ddp"], 2, env=ENV, timeout=300))
    assert sorted(by_rank) == [0, 1, 2, 3]
    for r in by_rank.values():
        assert r["relative_difference"] < 1e-6, r


def failure_run(cause, algorithm_env=None, per_host=(2, 2)):
    """A job of two hosts (`per_host` ranks each) all-reducing in a loop; `cause(hosts)` strikes
    host 1 once every rank is running. Returns the survivors' results, when the strike happened
    and the leftovers. `algorithm_env`: MULTIHOST_ALGORITHM and MULTIHOST_COUNT for the loop."""
    world = sum(per_host)
    timeout = 6
    with EmulatedHosts(2) as hosts:
        ready = f"/tmp/ringcomm-multihost-ready-{os.getpid()}"
        env = dict(ENV, MULTIHOST_TIMEOUT=str(timeout), MULTIHOST_READY=ready,
                   **(algorithm_env or {}))
        struck = {}

        def strike():
            while not all(os.path.exists(f"{ready}.{r}") for r in range(world)):
                time.sleep(0.05)
            struck["at"] = time.time()
            cause(hosts)

        thread = threading.Thread(target=strike, daemon=True)
        thread.start()
        try:
            # torchrun's agent on host 0 waits (300 s) for the lost host's agent at exit: the
            # survivors' own exit is what counts, so the launch is cut short.
            outputs = hosts.torchrun([JOB, "failure"], list(per_host), env=env,
                                     timeout=3 * timeout + 15)
        except emulated_hosts.HostsTimeout as cut:
            outputs = cut.outputs
        finally:
            for r in range(world):
                if os.path.exists(f"{ready}.{r}"):
                    os.remove(f"{ready}.{r}")
        thread.join(timeout=5)
        leftovers = [hosts.shm_files(h) for h in range(2)]
    host0 = outputs[0]
    found = [json.loads(line.split(" ", 1)[1]) for line in host0[1].splitlines()
             if line.startswith("RESULT ")]
    exited = host0[2].count("exiting")  # lines the survivors wrote once closed (multihost_job)
    return (found, exited, struck.get("at"), timeout, leftovers,
            emulated_hosts.format_outputs(outputs))


@pytest.mark.parametrize("algorithm_env", [
    None, {"MULTIHOST_ALGORITHM": "recursive_doubling", "MULTIHOST_COUNT": "1000"},
    *({"MULTIHOST_ALGORITHM": "recursive_doubling", "MULTIHOST_COUNT": "1000",
       "MULTIHOST_COLLECTIVE": c} for c in ("reduce_scatter", "all_gather"))],
    ids=["ring", "recursive_doubling", "recursive_doubling_reduce_scatter",
         "recursive_doubling_all_gather"])
@pytest.mark.parametrize("cause", ["kill_host", "link_down"])
def test_a_lost_host_is_named_by_the_survivors_within_the_timeout(cause, algorithm_env):
    found, exited, struck, timeout, leftovers, shown = failure_run(
        lambda hosts: getattr(hosts, cause)(1), algorithm_env)
    assert sorted(r["rank"] for r in found) == [0, 1], shown
    assert exited == 2, shown  # both closed their communicator and left main()
    for r in found:
        assert r["kind"] in ("PeerError", "CommTimeoutError"), r
        # The rank it lost (or waited for) and its host are named, directly or in the reason
        # a peer on this host aborted with.
        assert "host1" in r["message"] and ("rank 2" in r["message"] or "rank 3" in r["message"]), r
        assert r["failed_at"] - struck < timeout + 5, (r, struck)
    assert leftovers == [[], []], leftovers


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_a_lost_host_of_uneven_hosts_is_named_by_the_survivors_within_the_timeout(collective):
    through_leaders = {"MULTIHOST_COLLECTIVE": collective, "RINGCOMM_UNEVEN_LEADERS": "on"}
    found, exited, struck, timeout, leftovers, shown = failure_run(
        lambda hosts: hosts.kill_host(1), through_leaders, per_host=(3, 1))
    assert sorted(r["rank"] for r in found) == [0, 1, 2], shown
    assert exited == 3, shown
    for r in found:
        assert r["kind"] in ("PeerError", "CommTimeoutError"), r
        assert "host1" in r["message"] and "rank 3" in r["message"], r
        assert r["failed_at"] - struck < timeout + 5, (r, struck)
    assert leftovers == [[], []], leftovers
