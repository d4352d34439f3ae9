"""CommOptions: how a Communicator runs, resolved once when it is built.

Each field comes from the explicit argument, else its environment variable, else its default
(some defaults depend on the world size and the host's cores). The resolved options are handed
to the backends; nothing reads the environment at import time.

| field | environment | default |
|---|---|---|
| timeout | - | ``torch.distributed.default_pg_timeout`` |
| algorithm | RINGCOMM_ALGORITHM | ``"auto"`` (by size, the thresholds below); or any other name in ALGORITHMS (``"ring"``, ``"one_shot"``, ...); per call: ``algorithm=`` on all_reduce, reduce_scatter, all_gather; a collective the algorithm does not plan runs the ring |
| publish_bytes | RINGCOMM_SHM_PUBLISH_BYTES | 256 KiB: CPU publication size per rank and round (one-hop algorithms) |
| slice_bytes | - | the CPU transport's slot size; ``cuda_slice_bytes`` on CUDA |
| cuda_slice_bytes | RINGCOMM_CUDA_SLICE_BYTES | 4 MiB |
| slot_bytes | RINGCOMM_SHM_SLOT_BYTES | 64 KiB, 32 KiB when ranks outnumber the host's cores |
| slot_count | RINGCOMM_SHM_SLOTS | 16, 8 when ranks outnumber the host's cores |
| spin_us | RINGCOMM_SPIN_US | 50 us of polling when every rank can have a core (this process's affinity), else 0 |
| yield_us | RINGCOMM_YIELD_US | 2000 us of yielding next, then a waiter sleeps on a futex (no yields for 1 s after 4 of 16 lost the core for > 500 us: a busy machine) |
| debug | RINGCOMM_DEBUG (1 or DETAIL) | off |
| check_finite | RINGCOMM_CHECK_FINITE (1) | off |
| nccl_library | RINGCOMM_NCCL_LIBRARY | ``""``: NCCL already loaded (torch's), else the system's, else the nvidia-nccl-cu13 wheel's; a file or folder here is the only place looked at |
| nccl_sms | RINGCOMM_NCCL_SMS | 8: SMs the CUDA reduction kernels leave to NCCL's own |
| cuda_graphs | RINGCOMM_CUDA_GRAPHS (0 turns it off) | on: a CUDA ring collective repeated on the same buffers (DDP's buckets) is recorded as a CUDA graph at its second call and replayed by later ones |

docs/design.md says how slots, slices, waits and thresholds were chosen.

``auto``'s thresholds: one field per algorithm it picks by size, with the algorithm table's
defaults and uses (csrc/include/ringcomm/algorithms.h; ``THRESHOLDS``); the ring past them all.

"""
import dataclasses
import os

from . import _C
from .rendezvous import timeout_seconds

# Algorithm names, from the C++ table (kAlgorithms in csrc/include/ringcomm/algorithms.h): "ring";
# "one_shot" (all_reduce, reduce_scatter, all_gather) and "two_shot" (all_reduce) read every
# rank's publication in one hop (CPU shared memory); "auto" picks by size (the *_max_bytes
# thresholds), the same on every rank. ALGORITHM_COLLECTIVES: the collectives each one runs.
ALGORITHMS = tuple(_C.Algorithm.__members__)
ALGORITHM_COLLECTIVES = {name: tuple(collectives)
                        for name, collectives in _C.ALGORITHM_COLLECTIVES.items()}
# The collectives an algorithm other than the ring plans, in the table's order: their calls take
# algorithm= (auto plans what the ring plans, so it adds none).
COLLECTIVES_WITH_ALGORITHM = tuple(
    name for name in _C.COLLECTIVES
    if any(name in ALGORITHM_COLLECTIVES[a] for a in ALGORITHMS if a not in ("ring", "auto")))
# auto's thresholds, {field: default}, from the same table: "<algorithm>_max_bytes" for every
# algorithm auto picks by size, set by RINGCOMM_<ALGORITHM>_MAX_BYTES.
THRESHOLDS = dict(_C.DEFAULT_THRESHOLDS)


def check_algorithm(name, collective=None):
    """`name` if it is an algorithm (that runs `collective`, when given), else ValueError."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; one of {ALGORITHMS}")
    if collective is not None and collective not in ALGORITHM_COLLECTIVES[name]:
        runs = [a for a in ALGORITHMS if collective in ALGORITHM_COLLECTIVES[a]]
        raise ValueError(f"algorithm {name!r} does not run {collective}; one of {runs}")
    return name


def algorithm_for(name, collective):
    """The algorithm `collective` runs by default when the option says `name`: `name` where it
    runs that collective (two_shot runs all_reduce only), else the ring."""
    return name if collective in ALGORITHM_COLLECTIVES[check_algorithm(name)] else "ring"


def _flag(*on):
    return lambda text: text.upper() in on


def _size(text):
    return int(text) or None  # 0: the default


# field: (environment variable, parser)
_ENVIRONMENT = {
    "algorithm": ("RINGCOMM_ALGORITHM", str.lower),
    **{field: (f"RINGCOMM_{field.upper()}", int) for field in THRESHOLDS},
    "publish_bytes": ("RINGCOMM_SHM_PUBLISH_BYTES", _size),
    "cuda_slice_bytes": ("RINGCOMM_CUDA_SLICE_BYTES", _size),
    "slot_bytes": ("RINGCOMM_SHM_SLOT_BYTES", _size),
    "slot_count": ("RINGCOMM_SHM_SLOTS", _size),
    "spin_us": ("RINGCOMM_SPIN_US", int),
    "yield_us": ("RINGCOMM_YIELD_US", int),
    "debug": ("RINGCOMM_DEBUG", _flag("1", "DETAIL")),
    "check_finite": ("RINGCOMM_CHECK_FINITE", _flag("1")),
    "nccl_library": ("RINGCOMM_NCCL_LIBRARY", str),
    "nccl_sms": ("RINGCOMM_NCCL_SMS", int),
    "cuda_graphs": ("RINGCOMM_CUDA_GRAPHS", lambda value: value.strip().lower() not in
                    ("0", "false", "off")),
}


@dataclasses.dataclass(frozen=True)
class _Options:
    """How a :class:`ringcomm.Communicator` runs; ``None`` means the environment, else the
    default (see the module's table). Pass one, or its fields as keywords, to the Communicator.

    Example::

        comm = ringcomm.Communicator(options=ringcomm.CommOptions(slot_count=8, debug=True))
        comm.options.slot_bytes   # resolved: 65536 on a host with a core per rank
    """

    timeout: object = None  # seconds or a datetime.timedelta
    algorithm: str = None  # the default for all_reduce, reduce_scatter and all_gather
    publish_bytes: int = None  # CPU: one publication (per rank and round) of one-hop algorithms
    slice_bytes: int = None  # pipelining granularity on every device
    cuda_slice_bytes: int = None
    slot_bytes: int = None  # CPU: bytes of one shared-memory slot (the largest message)
    slot_count: int = None  # CPU: slots per ring link
    spin_us: int = None  # CPU: microseconds a waiting rank polls before it yields
    yield_us: int = None  # CPU: microseconds of yielding before a waiting rank sleeps
    debug: bool = None  # exchange a descriptor of every collective first
    check_finite: bool = None  # look for NaN/Inf in every input first
    nccl_library: str = None  # CUDA: NCCL's library file or folder ("": search)
    nccl_sms: int = None  # CUDA: SMs the reduction kernels leave to NCCL
    cuda_graphs: bool = None  # CUDA: replay repeated ring collectives as recorded graphs

    def replace(self, **fields):
        """A copy with the fields given that are not None replaced."""
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if v is not None})

    def resolved(self, world_size):
        """Every field set: explicit value > environment > default for `world_size` ranks."""
        values = {}
        for field, (name, parse) in _ENVIRONMENT.items():
            value = getattr(self, field)
            if value is None and os.environ.get(name):
                value = parse(os.environ[name])
            values[field] = value
        crowded = world_size > (os.cpu_count() or 1)  # the host's cores: every rank agrees
        defaults = {
            "algorithm": "auto",
            **THRESHOLDS,  # measured crossovers (algorithms.h; docs/design.md)
            "publish_bytes": 256 * 1024,
            "cuda_slice_bytes": 4 << 20,
            "slot_bytes": (32 if crowded else 64) * 1024,
            "slot_count": 8 if crowded else 16,
            # Spinning pays only when every rank can have a core to itself (this process's): then
            # it saves waking an idle core (30 us here); else it holds a core a peer needs.
            "spin_us": 50 if world_size <= len(os.sched_getaffinity(0)) else 0,
            "yield_us": 2000,
            "debug": False,
            "check_finite": False,
            "nccl_library": "",
            "nccl_sms": 8,
            "cuda_graphs": True,
        }
        for field, default in defaults.items():
            if values[field] is None:
                values[field] = default
        check_algorithm(values["algorithm"])
        values["debug"], values["check_finite"] = bool(values["debug"]), bool(values["check_finite"])
        return dataclasses.replace(self, timeout=timeout_seconds(self.timeout), **values)

    def thresholds(self):
        """{field: bytes} of auto's thresholds, as the C++ communicator takes them."""
        return {field: getattr(self, field) for field in THRESHOLDS}


# _Options' fields, then a threshold field for every algorithm auto picks by size (THRESHOLDS):
# a new algorithm's threshold needs no edit here.
CommOptions = dataclasses.make_dataclass(
    "CommOptions", [(field, int, None) for field in THRESHOLDS], bases=(_Options,), frozen=True,
    namespace={"__doc__": _Options.__doc__, "__module__": __name__})


def _threshold_rows():
    """The thresholds' rows of the module's table, from the C++ table's defaults."""
    rows = ["| field | environment | default |", "|---|---|---|"]
    for field, default in THRESHOLDS.items():
        algorithm = field.removesuffix("_max_bytes")
        size = f"{default // 1024} KiB" if default and default % 1024 == 0 else f"{default} B"
        rows.append(f"| {field} | {_ENVIRONMENT[field][0]} | {size if default else '0 (never)'}: "
                    f"``auto`` runs {algorithm} up to here ({_C.THRESHOLD_USES[field]}) |")
    return "\n".join(rows) + "\n"


if __doc__:  # not under python -OO
    __doc__ += _threshold_rows()
