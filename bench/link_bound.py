"""What a shaped link between hosts allows an all_reduce (bench/run.py --link-rate).

Each host's link carries, per direction: two-level all_reduce (ringcomm across hosts: a shard
per local rank on a ring of hosts) 2(H-1)/H of the data; a flat ring whose hosts' ranks are
adjacent (gloo) 2(N-1)/N of it through the one ring link that leaves each host. The bound is the
busbw (nccl-tests' 2(N-1)/N scaling) at which moving those bytes takes the whole link."""
import re

UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def rate_bytes(text):
    """Bytes per second of a tc-style rate ("3gbit", "500mbit")."""
    match = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", text.strip().lower())
    if not match:
        raise ValueError(f"a link rate such as 3gbit or 500mbit, not {text!r}")
    return float(match[1]) * UNITS[match[2]] / 8


def all_reduce_bounds(rate, hosts, world):
    """{"two-level": busbw, "flat ring": busbw} in GB/s for a link of `rate` bytes/s."""
    scale = 2 * (world - 1) / world  # busbw = algbw * scale
    return {"two-level": rate / (2 * (hosts - 1) / hosts) * scale / 1e9,
            "flat ring": rate / scale * scale / 1e9}


def describe(text, hosts, world):
    bounds = all_reduce_bounds(rate_bytes(text), hosts, world)
    return (f"# link {text} per host and direction, {world} ranks on {hosts} hosts: "
            f"all_reduce busbw bound {bounds['two-level']:.3f} GB/s two-level (ringcomm), "
            f"{bounds['flat ring']:.3f} GB/s flat ring (gloo)")
