"""Processes a test starts with subprocess: this checkout's ringcomm on their path, free
ports, and every process killed at the end, including the ones they start in sessions of their
own (torchrun's workers), which report their pids in a folder."""
import os
import signal
import socket
import subprocess
from pathlib import Path

import ringcomm


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout_env():
    """The environment with this checkout's ringcomm first on the path (not an installed one)."""
    root = str(Path(ringcomm.__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        root, os.environ.get("PYTHONPATH")])))


class Processes:
    """Processes a test starts, and the workers they report in <out>/pids, all killed at the
    end whatever happened."""

    def __init__(self, out):
        self.out, self.started = out, []

    def start(self, args, env, log):
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.started.append(proc)
        return proc

    def pids(self):
        folder = self.out / "pids"
        return {int(p) for p in os.listdir(folder)} if folder.exists() else set()

    def kill_all(self):
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in self.pids():
            if self._still_ours(pid):
                os.kill(pid, signal.SIGKILL)

    def _still_ours(self, pid):
        """Whether `pid` is still a worker of this test (not a process that reused the pid)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return str(self.out).encode() in f.read()
        except OSError:
            return False
