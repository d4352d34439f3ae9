"""tools/emulated_hosts.py: hosts with their own network, /dev/shm and hostname on one machine,
proved with torch's own gloo backend (needs root; skipped elsewhere)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import emulated_hosts  # noqa: E402
from emulated_hosts import EmulatedHosts, HostsTimeout  # noqa: E402

OK, WHY = emulated_hosts.available()
pytestmark = [pytest.mark.system, pytest.mark.skipif(not OK, reason=WHY)]
JOB = str(ROOT / "tests" / "support" / "emulated_hosts_job.py")


def root_links():
    """Names of the machine's own links that the harness could have made (it makes none)."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
    return {n for n in names if n.startswith(("vh", "br0", emulated_hosts.INTERFACE))}


@pytest.fixture(scope="module")
def hosts():
    with EmulatedHosts(2) as h:
        yield h


def test_hostnames_and_boot_ids_differ_per_host(hosts):
    names = [hosts.run(h, ["hostname"]).stdout.strip() for h in range(2)]
    assert names == ["host0", "host1"]
    assert socket.gethostname() not in names
    boot_id = "/proc/sys/kernel/random/boot_id"
    boots = {hosts.run(h, ["cat", boot_id]).stdout for h in range(2)} | {open(boot_id).read()}
    assert len(boots) == 3
    # Every host's name resolves to its address, in every host.
    assert hosts.run(1, ["getent", "hosts", "host0"]).stdout.split()[0] == hosts.address(0)


def test_dev_shm_is_per_host(hosts):
    name = f"emulated-hosts-test-{os.getpid()}"
    writer = hosts.run(0, ["sh", "-c", f"echo hello > /dev/shm/{name}"])
    assert writer.returncode == 0, writer.stderr
    assert hosts.run(0, ["cat", f"/dev/shm/{name}"]).stdout == "hello\n"  # another process
    assert name in hosts.shm_files(0)
    assert name not in hosts.shm_files(1)
    assert not os.path.exists(f"/dev/shm/{name}")
    assert hosts.run(0, ["rm", f"/dev/shm/{name}"]).returncode == 0
    assert name not in hosts.shm_files(0)


def test_torchrun_gloo_all_reduce_across_hosts(hosts):
    outputs = hosts.torchrun([JOB], nproc_per_node=2, timeout=120)
    assert [rc for rc, _, _ in outputs] == [0, 0], emulated_hosts.format_outputs(outputs)
    expected = [4 * i + (1 + 2 + 3 + 4) * 10**12 for i in range(16)]
    ranks = {}
    for h, (_, out, _) in enumerate(outputs):
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(reports) == 2
        for r in reports:
            ranks[r["rank"]] = r
            assert r["hostname"] == f"host{h}"  # shared by the host's ranks
            assert r["rank"] == 2 * h + r["local_rank"]
            assert r["sum"] == expected
            # The host's two ranks share its /dev/shm; the other host's files are not there.
            assert r["shm"] == [f"emulated-hosts-job-{2 * h}", f"emulated-hosts-job-{2 * h + 1}"]
    assert sorted(ranks) == [0, 1, 2, 3]
    assert not [e for e in hosts.shm_files(0) + hosts.shm_files(1)
                if e.startswith("emulated-hosts-job-")]


def test_link_down_ends_the_job_and_everything_is_cleaned_up(tmp_path):
    links_before = root_links()
    marker = tmp_path / "running"
    with EmulatedHosts(2) as hosts:
        tag = hosts.tag

        def cut_when_running():
            deadline = time.monotonic() + 60
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            hosts.link_down(1)

        cutter = threading.Thread(target=cut_when_running, daemon=True)
        cutter.start()
        start = time.monotonic()
        try:
            outputs = hosts.torchrun([JOB, "--loop", str(marker), "--timeout", "5"],
                                     nproc_per_node=1, timeout=25)
            assert any(rc != 0 for rc, _, _ in outputs), emulated_hosts.format_outputs(outputs)
        except HostsTimeout as e:
            assert len(e.outputs) == 2
        assert marker.exists(), "the job never ran across the hosts"
        assert time.monotonic() - start < 40
        cutter.join()
        # kill_host: every process of the host dies; its /dev/shm stays readable.
        sleeper = hosts.popen(1, ["sleep", "100"])
        hosts.kill_host(1)
        assert sleeper.returncode == -9
        assert isinstance(hosts.shm_files(1), list)
    assert not [n for n in emulated_hosts.netns_names() if n.startswith(tag)]
    assert root_links() == links_before


def test_cleanup_after_an_error_inside():
    links_before = root_links()
    with pytest.raises(ZeroDivisionError):
        with EmulatedHosts(3, rate="1gbit") as hosts:
            tag = hosts.tag
            hosts.popen(2, ["sleep", "100"])
            assert len([n for n in emulated_hosts.netns_names() if n.startswith(tag)]) == 4
            1 / 0
    assert not [n for n in emulated_hosts.netns_names() if n.startswith(tag)]
    assert root_links() == links_before
