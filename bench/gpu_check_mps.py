"""MPS for the GPU check, off unless RINGCOMM_GPU_CHECK_MPS=1: started after the build, kept only
when an NCCL all_reduce between two ranks ran under it, and stopped at the end."""
import os
import shutil
import subprocess

# Run under MPS right after its daemon starts: an NCCL all_reduce between two ranks sharing the
# GPU, as the tests' ranks will. A server that cannot serve (a container without the rights it
# needs), or NCCL that fails under it, would otherwise fail every later stage: the whole check.
MPS_PROBE = r"""
import os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
from ringcomm import cuda_backend

def rank(r, world, store):
    os.environ.update(cuda_backend.shared_gpu_env(r))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=r, world_size=world,
                            device_id=torch.device("cuda", 0))
    x = torch.full((1 << 20,), r + 1.0, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert bool(torch.all(x == world * (world + 1) / 2)), "wrong sum under MPS"
    dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)
"""
MPS_PROBE_S = 45  # a launch of two ranks and one NCCL communicator, with room

_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def wanted():
    """MPS only when asked: not yet shown to work with NCCL on the machine the check is written
    for, its probe costs a launch, and a broken server would take every later stage with it."""
    return os.environ.get("RINGCOMM_GPU_CHECK_MPS") == "1"


class Mps:
    """The MPS control daemon of one check: `python` runs the probe from `cwd`, its pipes and
    logs go under `work`, `say` reports what a later stage should know."""

    def __init__(self, python, work, cwd, dry, say):
        self.python, self.work, self.cwd, self.dry, self.say = python, work, cwd, dry, say
        self.control = (None, None)  # (nvidia-cuda-mps-control, its environment) while it runs

    def start(self, env):
        """MPS lets ranks sharing the GPU run kernels at once instead of time-sliced; it is kept
        only when an NCCL all_reduce ran under it. `env`, the stages' environment, gets the
        daemon's variables while it is kept. Returns what happened, in words."""
        control = shutil.which("nvidia-cuda-mps-control")
        if self.dry or control is None:
            return "not started" + (" (dry run)" if self.dry else
                                    " (nvidia-cuda-mps-control not found)")
        pipes = self.work / "mps"
        pipes.mkdir(exist_ok=True)
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipes), CUDA_MPS_LOG_DIRECTORY=str(pipes))
        try:
            proc = subprocess.run([control, "-d"], env=env, capture_output=True, text=True,
                                  timeout=10)
        except Exception as error:
            proc, why = None, f"failed to start: {error}"
        else:
            why = f"failed to start (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
        if proc is None or proc.returncode != 0:
            for key in _VARIABLES:
                env.pop(key)
            return why
        self.control = (control, env.copy())
        probe = self.work / "mps_probe.py"  # a file: spawned ranks import their function by name
        probe.write_text(MPS_PROBE)
        try:
            run = subprocess.run([self.python, str(probe)], cwd=self.cwd, env=env,
                                 capture_output=True, text=True, timeout=MPS_PROBE_S,
                                 start_new_session=True)
            why = f"rc {run.returncode}: {run.stderr.strip()[-300:]}"
            usable = run.returncode == 0
        except subprocess.TimeoutExpired:
            why, usable = f"an NCCL all_reduce took over {MPS_PROBE_S} s", False
        if not usable:  # without MPS the ranks are time-sliced, but they run
            self.stop()
            self.control = (None, None)
            for key in _VARIABLES:
                env.pop(key)
            return f"started but unusable ({why}): stopped, running without MPS"
        return "started (an NCCL all_reduce ran under it)"

    def stop(self):
        control, env = self.control
        if control:
            try:  # never in the way of the final summary
                subprocess.run([control], input="quit\n", env=env, text=True, timeout=10,
                               capture_output=True)
            except Exception as error:
                self.say(f"== stopping MPS failed: {error}")
