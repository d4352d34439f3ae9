"""bench/gpu_check: its stage logic, run here in dry-run mode (no GPU needed). The lease returns
at most 8 files from $OUT, and a run cut short must still report: so at most 8 files, and
summary.json rewritten after every stage; stages past their limit are killed, world-4 stages
run only while time is left."""
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402


def test_dry_run_through_the_script_bounds_the_output(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "RINGCOMM_GPU_CHECK_DRY": "1"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in out.rglob("*"))
    assert files == sorted(gpu_check.OUTPUT_FILES) and len(files) <= 8
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["finished"]
    names = [s["name"] for s in summary["stages"]]
    assert names[:4] == ["env", "build", "info", "kernels"], "kernel bandwidth first after build"
    assert names.index("allreduce2") < names.index("allreduce4")
    assert names.index("tests2") < names.index("tests4")
    assert all(s["rc"] == 0 for s in summary["stages"]), summary["stages"]
    # The environment stage really ran: it names the interpreters and the NCCL it loaded.
    env_found = summary["results"]["env"]
    assert {"python", "python3", "nvcc"} <= env_found["which"].keys()
    assert summary["multi_rank_path"] == env_found.get("multi_rank_path", "unknown")
    assert summary["mps"].startswith("not started")
    assert summary["results"]["tests2"]["tests"] == 1
    with tarfile.open(out / "bundle.tar.gz") as bundle:
        assert {"kernels.json", "allreduce2.json", "tests2.xml"} <= set(bundle.getnames())
    assert "== tests2" in (out / "check.log").read_text()


def test_summary_is_rewritten_after_every_stage(tmp_path):
    snapshots = []

    def seen(summary):
        snapshots.append(summary)
        assert len(list((tmp_path / "out").iterdir())) <= 8

    gpu_check.Check(tmp_path / "out", sys.executable, dry=True, on_summary=seen).run()
    stages = len(gpu_check.plan(sys.executable, tmp_path))
    assert len(snapshots) == stages + 1  # once per stage, once at the end
    for k, summary in enumerate(snapshots[:-1]):
        assert len(summary["stages"]) == k + 1 and "finished" not in summary
    assert snapshots[-1]["finished"]


def test_stages_past_their_limit_are_killed_and_late_stages_skipped(tmp_path, monkeypatch):
    py = sys.executable
    stages = [
        gpu_check.Stage("hangs", 1, [py, "-c", "import time; print('started', flush=True); "
                                               "time.sleep(60)"], needs_gpu=False),
        gpu_check.Stage("ignores_term", 1, [py, "-c", "import signal, time; "
                                                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                                      "time.sleep(60)"], needs_gpu=False),
        gpu_check.Stage("fails", 5, [py, "-c", "raise SystemExit(3)"], needs_gpu=False),
        gpu_check.Stage("world4", 60, [py, "-c", "pass"], needs_gpu=False, optional=True),
    ]
    monkeypatch.setattr(gpu_check, "plan", lambda *args, **kwargs: stages)
    monkeypatch.setattr(gpu_check, "KILL_AFTER", 1)
    summary = gpu_check.Check(tmp_path / "out", py, dry=True, budget=30).run()
    hangs, ignores, fails, world4 = summary["stages"]
    assert hangs["timed_out"] and hangs["rc"] != 0 and hangs["seconds"] < 10
    assert ignores["timed_out"] and ignores["rc"] == -9  # SIGKILL after the slack
    assert fails["rc"] == 3 and not fails["timed_out"], "a failing stage does not stop the run"
    assert world4["rc"] is None and "not enough time" in world4["skipped"]
    assert summary["seconds"] < 30
    assert "started" in (tmp_path / "out" / "check.log").read_text()


def test_cuda_home_comes_from_the_toolkit_not_a_wrapper(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime_api.h").write_text("")
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    links = tmp_path / "bin"
    links.mkdir()
    (links / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(links))
    assert gpu_check.cuda_home() == str(toolkit)
    (links / "nvcc").unlink()
    (links / "nvcc").write_text("#!/bin/sh\n")  # a wrapper script: no toolkit next to it
    (links / "nvcc").chmod(0o755)
    assert gpu_check.cuda_home() == "/usr/local/cuda"
