"""ringcomm's TCP listeners fuzzed by a stranger on the network: a 2-host job (one rank per
emulated host, tools/emulated_hosts.py) all-reduces and sends round the world in a loop while a
process on a third host (tests/support/tcp_fuzzer.py) sends its listeners random bytes,
truncated and oversized hellos and frames, wrong magics, other worlds' hellos and wrong secrets,
and holds a few hundred connections that never say hello. Every result stays exact, no rank
fails or hangs, memory stays bounded and the log names the stranger's address; the same while
the job shuts down. Needs root; skipped elsewhere."""
import json
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import emulated_hosts  # noqa: E402
from emulated_hosts import EmulatedHosts  # noqa: E402
from subprocesses import checkout_env  # noqa: E402

OK, WHY = emulated_hosts.available()
pytestmark = [pytest.mark.system, pytest.mark.skipif(not OK, reason=WHY)]
SUPPORT = ROOT / "tests" / "support"
STRANGER = 2  # the host the fuzzer runs on; the job runs on hosts 0 and 1


@pytest.fixture(scope="module")
def hosts():
    with EmulatedHosts(3) as h:
        yield h


def fuzzed_run(hosts, shutdown):
    """The job's output by host, each rank's RESULT and the fuzzer's summary. The job stops
    once the fuzzer ends (with `shutdown`: once its first round is done, and closes while the
    fuzzer goes on)."""
    with tempfile.TemporaryDirectory() as folder:
        env = {"PYTHONPATH": checkout_env()["PYTHONPATH"], "FUZZ_DIR": folder,
               "RINGCOMM_LOG": "INFO"}
        fuzzer = hosts.popen(STRANGER, [
            sys.executable, str(SUPPORT / "tcp_fuzzer.py"), f"{folder}/addresses.*",
            "--seconds", "4", "--started", f"{folder}/fuzzing"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def end_the_job():
            fuzzer.wait()
            Path(folder, "done").touch()

        threading.Thread(target=end_the_job, daemon=True).start()
        try:
            outputs = hosts.torchrun([str(SUPPORT / "fuzzed_job.py")] +
                                     (["shutdown"] if shutdown else []),
                                     1, env=env, timeout=90, nodes=2)
            if any(rc for rc, _, _ in outputs):
                fuzzer.kill()  # it would wait for addresses a failed job never wrote
            fuzzed, fuzz_err = fuzzer.communicate(timeout=60)
        finally:
            if fuzzer.poll() is None:
                fuzzer.kill()
                fuzzer.communicate()
    shown = emulated_hosts.format_outputs(outputs)
    assert [rc for rc, _, _ in outputs] == [0, 0], shown
    assert fuzzer.returncode == 0, fuzz_err
    summary = json.loads(fuzzed.split("FUZZED ", 1)[1])
    found = [json.loads(line.split(" ", 1)[1]) for _, out, _ in outputs
             for line in out.splitlines() if line.startswith("RESULT ")]
    return outputs, {r["rank"]: r for r in found}, summary, shown


def check_dropped_logged(outputs, hosts, by_rank):
    stranger = re.escape(hosts.address(STRANGER))
    for h, (_, _, err) in enumerate(outputs):
        lines = re.findall(rf"ringcomm INFO rank {h} of 2 \(listening on \S+\) dropped a "
                           rf"connection from {stranger}:\d+: (.*)", err)
        assert lines, err[-3000:]
        reasons = "\n".join(lines)
        for reason in ("lacks this communicator's secret", "has the wrong magic"):
            assert reason in reasons, (reason, reasons[-3000:])
        assert not re.search(r"dropped a connection from (?!" + stranger + ")", err), err[-3000:]
    assert sorted(by_rank) == [0, 1]


def test_a_job_fuzzed_by_a_stranger_stays_exact_and_bounded(hosts):
    outputs, by_rank, summary, shown = fuzzed_run(hosts, shutdown=False)
    check_dropped_logged(outputs, hosts, by_rank)
    for r in by_rank.values():
        assert r["wrong"] == 0 and r["rounds"] > 10, r
        assert len(r["listening"]) == 2, r  # the ring's and point-to-point's
        # A few hundred strangers' connections cost no lasting memory (a queue of 64 at most).
        assert r["rss_after_kib"] - r["rss_before_kib"] < 32 << 10, r
    sent = summary["sent"]
    assert sent.get("idle", 0) >= 300 and summary["rounds"] >= 2, summary
    assert all(sent.get(kind, 0) > 0 for kind in (
        "random bytes", "truncated hello", "oversized hello", "wrong magic", "other world",
        "no secret", "wrong secret", "hello and data frame", "bare frame")), summary


def test_a_job_shutting_down_while_fuzzed_closes_cleanly(hosts):
    outputs, by_rank, summary, shown = fuzzed_run(hosts, shutdown=True)
    for r in by_rank.values():
        assert r["wrong"] == 0, r
    assert summary["rounds"] >= 1, summary
