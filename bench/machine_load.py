"""The machine's own load: busy-looping processes on demand, and how busy the cores were (and
how much the hypervisor took) while a benchmark ran."""
import contextlib
import multiprocessing


def _spin():
    while True:
        pass


@contextlib.contextmanager
def busy_load(processes):
    """`processes` busy-looping processes for the duration: a busy machine on demand."""
    ctx = multiprocessing.get_context("fork")
    spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
        for p in spinners:
            p.join()


def cpu_times():
    """The machine's CPU time so far, from /proc/stat: {busy, steal, total} in clock ticks (empty
    where /proc/stat is missing). Two readings give the share of the machine that was busy and
    that the hypervisor took (steal) in between."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return {}
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return {"busy": user + nice + system + irq + softirq, "steal": steal, "total": total}


def machine_load(before, after):
    """{busy_pct, steal_pct} of the machine's cores between two cpu_times() readings."""
    ticks = after.get("total", 0) - before.get("total", 0)
    if ticks <= 0:
        return {}
    return {k + "_pct": 100 * (after[k] - before[k]) / ticks for k in ("busy", "steal")}
