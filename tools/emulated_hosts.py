"""Several emulated hosts on one machine, for multi-host tests and benchmarks (Linux, root).

Each host is a network namespace joined to the others through a bridge in a "switch" namespace
of its own, with a private /dev/shm (a tmpfs in a mount namespace), its own hostname ("host0",
"host1", ...), boot id, and an /etc/hosts that names every host. Nothing is added to the
machine's own namespaces, and the hosts have no route beyond their subnet: only addresses
assigned here, inside these namespaces, are ever contacted.

    python tools/emulated_hosts.py --hosts 2 --nproc-per-node 2 script.py [args...]
    python tools/emulated_hosts.py --hosts 2 --nproc-per-node 2 --rate 3gbit bench/run.py -e 1M
    python tools/emulated_hosts.py --hosts 2 --rate 3gbit --tcp-check   # a plain TCP transfer

    with EmulatedHosts(2, rate="3gbit") as hosts:
        results = hosts.torchrun(["job.py"], nproc_per_node=2)  # [(returncode, stdout, stderr)]

Every process of a host is started with nsenter into that host's one long-lived init process
(its network, mount and UTS namespaces), so all of them share the host's /dev/shm. Processes of
different hosts still share one PID namespace.
"""
import argparse
import contextlib
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

# 198.18.0.0/15 is set aside for network benchmarks (RFC 2544): 512 /24 subnets, one per instance.
SUBNETS = 512
INTERFACE = "eth0"  # each host's link to the switch, inside the host
TOOLS = ("ip", "unshare", "nsenter", "tc", "mount", "hostname")
_instances = itertools.count()

# The init process of a host: a private /dev/shm, every host's name in /etc/hosts (so that a
# hostname resolves to the host's address, as gloo expects), a boot id of its own (as separate
# machines have), the hostname; then it waits.
INIT = ('mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind "$2" /etc/hosts'
        ' && mount --bind "$3" /proc/sys/kernel/random/boot_id'
        ' && hostname "$1" && echo ready && exec sleep infinity')

RECEIVER = """import socket, sys, time
s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); c.recv_into(buf); n, t0 = 0, time.perf_counter()
while k := c.recv_into(buf): n += k
print(n, time.perf_counter() - t0)
"""
SENDER = """import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = bytes(1 << 20)
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end: c.sendall(buf)
c.close()
"""


class HostsTimeout(TimeoutError):
    """A job ran past its timeout; `outputs` holds each host's (returncode, stdout, stderr)."""

    def __init__(self, message, outputs):
        super().__init__(message)
        self.outputs = outputs


def _run(argv, check=True):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_names():
    """The names `ip netns list` shows."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines()
            if line.strip()]


def available():
    """(True, "") where emulated hosts can be made here, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "emulated hosts need root (network and mount namespaces)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return False, f"emulated hosts need {', '.join(missing)} on PATH"
    name = f"rcprobe{os.getpid()}-{next(_instances)}"
    try:
        _run(["ip", "netns", "add", name])
        _run(["ip", "netns", "exec", name, "unshare", "--mount", "--uts", "true"])
    except (OSError, RuntimeError) as e:
        return False, f"cannot create namespaces here: {e}"
    finally:
        if os.path.exists(f"/run/netns/{name}"):
            _run(["ip", "netns", "del", name], check=False)
    return True, ""


def rate_bits(rate):
    """Bits per second of a tc rate ("3gbit", "500mbit", "100mbps" = bytes, plain = bits)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?", str(rate).strip().lower())
    if not m:
        raise ValueError(f"not a rate: {rate!r} (e.g. 3gbit, 500mbit)")
    scale = 1000 ** " kmgt".index(m.group(2) or " ")
    return int(float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1))


def _processes_in(netns_path):
    """Pids of the processes in the network namespace bound at netns_path."""
    try:
        target = os.stat(netns_path)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:  # gone, or a zombie
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                pids.append(int(entry))
    return pids


class EmulatedHosts:
    """`count` emulated hosts; `rate` (e.g. "3gbit") shapes each host's link both ways."""

    def __init__(self, count, rate=None):
        if not 1 <= count <= 250:
            raise ValueError("count must be 1..250")
        if rate is not None:
            rate_bits(rate)  # a bad rate fails here, before anything is made
        n = next(_instances)
        self.count, self.rate = count, rate
        self.tag = f"rceh{os.getpid()}-{n}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{h}" for h in range(count)]
        k = (os.getpid() * 7 + n) % SUBNETS
        self.subnet = f"198.{18 + k // 256}.{k % 256}.0/24"
        self._prefix = self.subnet.rsplit(".", 1)[0]
        self._inits, self._procs, self._tmp = [], [], None

    # -- life cycle ------------------------------------------------------------------------
    def __enter__(self):
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _build(self):
        self._tmp = tempfile.mkdtemp(prefix=self.tag + "-")
        etc_hosts = os.path.join(self._tmp, "hosts")
        with open(etc_hosts, "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")
            f.writelines(f"{self.address(h)} {self.hostname(h)}\n" for h in range(self.count))
        os.chmod(etc_hosts, 0o644)
        sw = ["ip", "-n", self.switch]
        _run(["ip", "netns", "add", self.switch])
        _run(sw + ["link", "add", "br0", "type", "bridge"])
        for dev in ("lo", "br0"):
            _run(sw + ["link", "set", dev, "up"])
        for h, name in enumerate(self.names):
            _run(["ip", "netns", "add", name])
            port = f"vh{h}"
            _run(sw + ["link", "add", port, "type", "veth", "peer", "name", INTERFACE,
                       "netns", name])
            _run(sw + ["link", "set", port, "master", "br0", "up"])
            ns = ["ip", "-n", name]
            _run(ns + ["addr", "add", f"{self.address(h)}/24", "dev", INTERFACE])
            for dev in (INTERFACE, "lo"):
                _run(ns + ["link", "set", dev, "up"])
            if self.rate:
                self._shape(name, INTERFACE)
                self._shape(self.switch, port)
            self._start_init(h, etc_hosts)

    def _shape(self, netns, dev):
        bits = rate_bits(self.rate)
        burst = max(bits // 8 // 1000, 64 * 1024)  # ~1 ms at the rate: timers cannot pace finer
        _run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
              "rate", f"{bits}bit", "burst", str(burst), "latency", "20ms"])

    def _start_init(self, h, etc_hosts):
        boot_id = os.path.join(self._tmp, f"boot_id{h}")
        with open(boot_id, "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        os.chmod(boot_id, 0o444)
        init = subprocess.Popen(
            ["ip", "netns", "exec", self.names[h], "unshare", "--mount", "--uts", "--propagation",
             "private", "sh", "-c", INIT, "sh", self.hostname(h), etc_hosts, boot_id],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self._inits.append(init)
        ready, _, _ = select.select([init.stdout], [], [], 10)
        line = init.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            init.kill()
            init.wait()
            raise RuntimeError(f"host {h} did not start: {init.stderr.read().decode().strip()}")
        init.stdout.close(), init.stderr.close()
        self._procs.append([])

    def close(self):
        """Kills every process of every host, deletes every namespace (with its links) and
        checks that none remains."""
        try:
            for h in range(len(self._procs)):
                self.kill_host(h)
            for name in self.names:
                self._kill_all(name, keep=None)
            for init in self._inits:
                init.wait()
        finally:
            for name in self.names + [self.switch]:
                if os.path.exists(f"/run/netns/{name}"):
                    _run(["ip", "netns", "del", name], check=False)
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
        left = [n for n in netns_names() if n.startswith(self.tag + "-")]
        if left:
            raise RuntimeError(f"namespaces left behind: {left}")

    def _kill_all(self, name, keep):
        """SIGKILLs every process in namespace `name` but pid `keep`, until none is left."""
        deadline = time.monotonic() + 10
        while True:
            pids = [p for p in _processes_in(f"/run/netns/{name}") if p != keep]
            if not pids:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes in {name} survive SIGKILL: {pids}")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    # -- hosts -----------------------------------------------------------------------------
    def address(self, h):
        """Host h's IPv4 address (on its INTERFACE)."""
        return f"{self._prefix}.{h + 1}"

    def hostname(self, h):
        return f"host{h}"

    def popen(self, h, argv, env=None, **kw):
        """A process inside host h: subprocess.Popen's keywords (cwd too; the default is this
        process's); `env` is added to this process's environment. It gets a session of its
        own unless start_new_session=False."""
        cwd = os.path.abspath(kw.pop("cwd", None) or os.getcwd())
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(
            ["nsenter", "--target", str(self._inits[h].pid), "--mount", "--uts", "--net",
             f"--wd={cwd}", "--", *argv], env=dict(os.environ, **(env or {})), **kw)
        self._procs[h].append(proc)
        return proc

    def run(self, h, argv, timeout=60, **kw):
        """Runs argv inside host h to its end; a CompletedProcess with text output."""
        proc = self.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def shm_files(self, h):
        """What is in host h's /dev/shm (sorted names)."""
        return sorted(self.run(h, ["ls", "-A", "/dev/shm"]).stdout.split())

    def link_down(self, h):
        """Cuts host h off the switch (its link goes down)."""
        _run(["ip", "-n", self.names[h], "link", "set", INTERFACE, "down"])

    def link_up(self, h):
        _run(["ip", "-n", self.names[h], "link", "set", INTERFACE, "up"])

    def kill_host(self, h):
        """SIGKILLs every process started in host h (its /dev/shm stays, for leak checks)."""
        for proc in self._procs[h]:  # also the ones that have not entered the host yet
            if proc.poll() is None:
                proc.kill()
        self._kill_all(self.names[h], keep=self._inits[h].pid)
        for proc in self._procs[h]:
            proc.wait()

    # -- jobs ------------------------------------------------------------------------------
    def free_port(self, h=0):
        """A TCP port nothing listens on in host h."""
        code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        return int(self.run(h, [sys.executable, "-c", code]).stdout)

    def torchrun(self, script_argv, nproc_per_node, env=None, timeout=300, nodes=None):
        """Runs script_argv under torchrun on the first `nodes` hosts (default: every host;
        static rendezvous at host 0), `nproc_per_node` ranks on each (a list: host h's at h, as
        torchrun takes a different --nproc-per-node per node); returns each one's (returncode,
        stdout, stderr). Past
        `timeout` seconds every host's processes are killed and HostsTimeout carries what they
        wrote."""
        port = self.free_port(0)
        files, procs = [], []
        nodes = self.count if nodes is None else nodes
        per_host = (list(nproc_per_node) if isinstance(nproc_per_node, (list, tuple))
                    else [nproc_per_node] * nodes)
        for h in range(nodes):
            # Appends: the lines of a host's ranks never overwrite each other.
            out = open(os.path.join(self._tmp, f"torchrun{port}-{h}.out"), "a+")
            err = open(os.path.join(self._tmp, f"torchrun{port}-{h}.err"), "a+")
            files.append((out, err))
            procs.append(self.popen(h, [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                f"--node-rank={h}", f"--nproc-per-node={per_host[h]}",
                f"--master-addr={self.address(0)}", f"--master-port={port}",
                "--rdzv-backend=static", *script_argv], env=env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        timed_out = any(p.poll() is None for p in procs)
        if timed_out:
            for h in range(self.count):
                self.kill_host(h)
        outputs = []
        for proc, streams in zip(procs, files):
            for f in streams:
                f.seek(0)
            outputs.append((proc.wait(), *(f.read() for f in streams)))
            for f in streams:
                f.close()
        if timed_out:
            raise HostsTimeout(f"torchrun ran past {timeout} s on {nodes} hosts; killed. "
                               + format_outputs(outputs), outputs)
        return outputs

    def tcp_throughput(self, src, dst, seconds=2.0):
        """Bits per second of one plain TCP stream from host src to host dst."""
        receiver = self.popen(dst, [sys.executable, "-c", RECEIVER, self.address(dst)],
                              stdout=subprocess.PIPE, text=True)
        port = receiver.stdout.readline().strip()
        sender = self.run(src, [sys.executable, "-c", SENDER, self.address(dst), port,
                                str(seconds)], timeout=seconds + 30)
        if sender.returncode:
            receiver.kill()
            receiver.communicate()
            raise RuntimeError(f"TCP transfer failed: {sender.stderr}")
        nbytes, elapsed = receiver.communicate(timeout=30)[0].split()
        return int(nbytes) * 8 / float(elapsed)


def format_outputs(outputs):
    return "".join(f"\n== host{h}: exit {rc} ==\n{out}{err}"
                   for h, (rc, out, err) in enumerate(outputs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2, help="number of emulated hosts")
    p.add_argument("--nproc-per-node", default="1",
                   type=lambda text: [int(n) for n in text.split(",")],
                   help="ranks per host, or per host in host order (3,1: uneven hosts)")
    p.add_argument("--rate", help="shape each host's link both ways, e.g. 3gbit")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the job is killed")
    p.add_argument("--tcp-check", action="store_true",
                   help="first measure one plain TCP stream from host 0 to host 1")
    p.add_argument("script", nargs="?", help="the script torchrun runs on every host")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = p.parse_args(argv)
    ok, why = available()
    if not ok:
        p.error(why)
    # A plain kill still tears the hosts down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with EmulatedHosts(args.hosts, rate=args.rate) as hosts:
        print(f"{args.hosts} hosts on {hosts.subnet}, rate {args.rate or 'unshaped'}", flush=True)
        if args.tcp_check and args.hosts >= 2:
            for src, dst in ((0, 1), (1, 0)):
                bps = hosts.tcp_throughput(src, dst)
                print(f"TCP host{src} -> host{dst}: {bps / 1e9:.3f} Gbit/s", flush=True)
        if not args.script:
            return 0
        try:
            per_host = args.nproc_per_node * args.hosts if len(args.nproc_per_node) == 1 else (
                args.nproc_per_node)
            outputs = hosts.torchrun([args.script, *args.args], per_host,
                                     timeout=args.timeout)
        except HostsTimeout as e:
            outputs = e.outputs
            print(f"timed out after {args.timeout} s", file=sys.stderr)
        print(format_outputs(outputs).lstrip("\n"))
        return max(abs(rc) for rc, _, _ in outputs)


if __name__ == "__main__":
    sys.exit(main())
