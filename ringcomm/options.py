"""CommOptions: how a Communicator runs, resolved once when it is built.

Each field comes from the explicit argument, else its environment variable, else its default
(some defaults depend on the world size and the host's cores). The resolved options are handed
to the backends, which pass every value to the C++ core: the table below (``OPTIONS``) is the
only place a default is written. A size or count of 0 means its default; a variable's size may
carry a binary unit (``RINGCOMM_SHM_SLOT_BYTES=32K``). Nothing reads the
environment at import time. docs/benchmarks.md ("How the defaults were chosen") says how
slots, slices, waits and thresholds were chosen.

"""
import dataclasses
import os
import re
from typing import Callable, NamedTuple, Optional

from . import _C
from .world import pinning
from .world.rendezvous import timeout_seconds

# Algorithm names, from the C++ table (kAlgorithms in csrc/include/ringcomm/algorithms.h): "ring";
# "one_shot" (all_reduce, reduce_scatter, all_gather) and "two_shot" (all_reduce) read every
# rank's publication in one hop (CPU shared memory); "recursive_doubling" (all_reduce,
# reduce_scatter, all_gather, between hosts) pairs ranks in log2 N rounds; "auto" picks by size
# (the *_max_bytes thresholds), the same on every rank. ALGORITHM_COLLECTIVES: the collectives each one runs.
ALGORITHMS = tuple(_C.Algorithm.__members__)
ALGORITHM_COLLECTIVES = {name: tuple(collectives)
                        for name, collectives in _C.ALGORITHM_COLLECTIVES.items()}
# The collectives an algorithm other than the ring plans, in the table's order: their calls take
# algorithm= (auto plans what the ring plans, so it adds none).
COLLECTIVES_WITH_ALGORITHM = tuple(
    name for name in _C.COLLECTIVES
    if any(name in ALGORITHM_COLLECTIVES[a] for a in ALGORITHMS if a not in ("ring", "auto")))
# Algorithms between hosts: they send to any rank, so they need a transport that reaches every
# rank (TCP); inside a host (shared memory) the others run. recursive_doubling: log-depth
# all_reduce, reduce_scatter and all_gather (csrc/core/recursive_doubling_plans.cc,
# log_step_plans.cc).
BETWEEN_HOSTS = ("recursive_doubling",)
IN_HOST_ALGORITHMS = tuple(a for a in ALGORITHMS if a not in BETWEEN_HOSTS)
# auto's thresholds, {field: default}, from the same table: "<algorithm>_max_bytes" for every
# algorithm auto picks by size, set by RINGCOMM_<ALGORITHM>_MAX_BYTES.
THRESHOLDS = dict(_C.DEFAULT_THRESHOLDS)
# A threshold whose default is this (size_t's largest, kByHostCount in algorithms.h) is not one
# number: auto takes the alpha-beta model's crossover for the number of ranks it runs on
# (between hosts: the hosts) unless the option is set.
BY_HOST_COUNT = (1 << 64) - 1


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


class Option(NamedTuple):
    """One option: a CommOptions field, the environment variable that sets it (None: only the
    argument does), how that variable's text is read (which also says its type), its default
    (None: computed, as `doc` says) and a line of documentation. `crowded`: the default when
    ranks outnumber the cores (the doc says which cores), where it differs."""
    name: str
    environment: Optional[str]
    parse: Optional[Callable[[str], object]]
    default: object
    doc: str
    crowded: object = None


def _flag(*on):
    return lambda text: text.upper() in on


def _unless(*off):
    return lambda text: text.strip().lower() not in off


def _size(text):
    """A size or count: a whole number, optionally with a binary unit (``32K``, ``4MiB``); 0,
    given or in the environment, is the default (None)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:([KMG])(?:i?B)?)?\s*", str(text), re.IGNORECASE)
    if match is None:
        raise ValueError(f"{text!r} is not a size (a whole number, optionally K, M or G)")
    unit = match.group(2)
    return int(match.group(1)) << (10 * " KMG".index(unit.upper()) if unit else 0) or None


KiB, MiB = 1 << 10, 1 << 20

OPTIONS = (
    Option("timeout", None, None, None,
           "seconds (or a datetime.timedelta) any wait may take; default: "
           "``torch.distributed.default_pg_timeout`` (the torch backend: its group's)"),
    Option("algorithm", "RINGCOMM_ALGORITHM", str.lower, "auto",
           "``auto`` picks by size (the thresholds below); or any other name in ALGORITHMS "
           "(``ring``, ``one_shot``, ...); per call: ``algorithm=`` on all_reduce, reduce_scatter, "
           "all_gather; a collective the algorithm does not plan runs the ring"),
    Option("publish_bytes", "RINGCOMM_SHM_PUBLISH_BYTES", _size, 256 * KiB,
           "CPU: one publication per rank and round of the one-hop algorithms"),
    Option("slice_bytes", None, None, None,
           "pipelining granularity; default: ``slot_bytes`` on CPU, ``cuda_slice_bytes`` on CUDA"),
    Option("cuda_slice_bytes", "RINGCOMM_CUDA_SLICE_BYTES", _size, 4 * MiB,
           "CUDA: the slice, which is also the size of one NCCL staging slot"),
    Option("slot_bytes", "RINGCOMM_SHM_SLOT_BYTES", _size, 64 * KiB,
           "CPU: bytes of one shared-memory slot (the largest message); cores: the host's "
           "(every rank picks the same)",
           crowded=32 * KiB),
    Option("slot_count", "RINGCOMM_SHM_SLOTS", _size, 16,
           "CPU: slots per ring link; cores: the host's (every rank picks the same)",
           crowded=8),
    Option("spin_us", "RINGCOMM_SPIN_US", int, 50,
           "CPU: microseconds a waiting rank polls before it yields; cores: this process's "
           "(its affinity)", crowded=0),
    Option("yield_us", "RINGCOMM_YIELD_US", int, 2000,
           "CPU: microseconds of yielding next, then a waiter sleeps on a futex (no yields "
           "after 4 of 16 lost the core for > 500 us, a busy machine, until 3 probes in a row, "
           "one per 50-200 ms, find yields fast again)"),
    Option("pin_cores", "RINGCOMM_PIN_CORES", str.lower, "auto",
           "CPU: ``auto`` splits the CPUs of each host among its ranks and keeps each rank's "
           "calling thread, and threads it starts later, to its share (only where every rank "
           "there is a process allowed the same CPUs, one at least each; the first "
           "communicator decides); ``off``: never"),
    Option("uneven_leaders", "RINGCOMM_UNEVEN_LEADERS", str.lower, "auto",
           "across hosts of unequal rank counts: reduce_scatter and all_gather through each "
           "host's first rank where a leader sends fewer bytes between hosts than the flat "
           "ring's busiest host (``auto``; all_reduce always goes through them); ``on``: "
           "always; ``off``: never (the same on every rank)"),
    Option("socket_ifname", "RINGCOMM_SOCKET_IFNAME", str, "",
           "across hosts: the network interface whose IPv4 address peers on other hosts "
           "connect to; empty: the one that routes toward ``MASTER_ADDR``, else the host name's"),
    Option("socket_slot_bytes", "RINGCOMM_SOCKET_SLOT_BYTES", _size, 256 * KiB,
           "across hosts: bytes of one TCP message slot (``slot_count`` of them per peer and "
           "direction); the slice of the network's level of a two-level all_reduce"),
    Option("socket_connections", "RINGCOMM_SOCKET_CONNECTIONS", _size, 2,
           "across hosts: TCP connections per peer and direction; messages take them in turn"),
    Option("trace_buffer", "RINGCOMM_TRACE_BUFFER", int, 256,
           "calls each communicator keeps in its flight record (``flight_record()``; an error "
           "ends with the last few); 0: none"),
    Option("trace_dir", "RINGCOMM_TRACE_DIR", str, "",
           "a directory where each rank writes its flight record, a JSON file, when a call "
           "fails and when it closes (read them with ``python -m ringcomm.trace DIR``); "
           "empty: none written"),
    Option("log", "RINGCOMM_LOG", str.upper, "",
           "what the ``ringcomm`` logger prints to stderr: ``INFO`` a line per rank at set-up, "
           "``TRACE`` also a line per call; empty: nothing (your own handlers still get "
           "records); the process's first communicator sets it up"),
    Option("debug", "RINGCOMM_DEBUG", _flag("1", "DETAIL"), False,
           "on when the variable is 1 or DETAIL: exchange a descriptor of every collective "
           "first"),
    Option("check_finite", "RINGCOMM_CHECK_FINITE", _flag("1"), False,
           "on when the variable is 1: look for NaN/Inf in every input first"),
    Option("nccl_library", "RINGCOMM_NCCL_LIBRARY", str, "",
           "CUDA: NCCL's library file or folder, the only place looked at; empty: NCCL already "
           "loaded (torch's), else the system's, else the nvidia-nccl-cu13 wheel's"),
    Option("nccl_sms", "RINGCOMM_NCCL_SMS", int, 8,
           "CUDA: SMs the reduction kernels leave to NCCL's own"),
    Option("cuda_graphs", "RINGCOMM_CUDA_GRAPHS", _unless("0", "false", "off"), True,
           "CUDA: a ring collective repeated on the same buffers (DDP's buckets) is recorded "
           "as a CUDA graph at its second call and replayed by later ones; 0 turns it off"),
    Option("cuda_slot_count", "RINGCOMM_CUDA_SLOTS", _size, 8,
           "CUDA: NCCL staging slots per direction; half of them are slices in flight"),
    # auto's thresholds: their defaults are the algorithm table's (THRESHOLDS), one per
    # algorithm auto picks by size, so a new algorithm's threshold needs no edit here.
    *(Option(field, f"RINGCOMM_{field.upper()}", int, default,
             f"``auto`` runs {field.removesuffix('_max_bytes')} up to here "
             f"({_C.THRESHOLD_USES[field]}); 0: never")
      for field, default in THRESHOLDS.items()),
)

# The table's defaults, for a host with a core per rank.
DEFAULTS = {option.name: option.default for option in OPTIONS}


@dataclasses.dataclass(frozen=True)
class _Options:
    """How a :class:`ringcomm.Communicator` runs; ``None`` means the environment, else the
    default (``help(ringcomm.options)``: the table). Pass one, or its fields as keywords, to the
    Communicator.

    Example::

        comm = ringcomm.Communicator(options=ringcomm.CommOptions(slot_count=8, debug=True))
        comm.options.slot_bytes   # resolved: 65536 on a host with a core per rank
    """

    def replace(self, **fields):
        """A copy with the fields given that are not None replaced."""
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if v is not None})

    def resolved(self, world_size):
        """Every field set: explicit value > environment > default for `world_size` ranks."""
        # Slots follow the host's core count, so every rank picks the same (ranks whose slots
        # differ fail with MismatchError). Spinning pays only when every rank can have a core to
        # itself (this process's affinity): then it saves waking an idle core; else it holds a
        # core a peer needs.
        crowded = {"spin_us": world_size > len(pinning.available_cores())}
        host_crowded = world_size > (os.cpu_count() or 1)
        values = {}
        for option in OPTIONS:
            value = getattr(self, option.name)
            text = os.environ.get(option.environment) if option.environment else None
            if value is None and text:
                try:
                    value = option.parse(text)
                except ValueError as error:  # say which variable: it may be set far away
                    raise ValueError(f"{option.environment}={text!r}: {error}") from None
            if value is None or (value == 0 and option.parse is _size):  # a size of 0 too
                value = option.default
                if option.crowded is not None and crowded.get(option.name, host_crowded):
                    value = option.crowded
            values[option.name] = value
        check_algorithm(values["algorithm"])
        if values["pin_cores"] not in ("auto", "off"):
            raise ValueError(f"pin_cores={values['pin_cores']!r}: auto or off")
        if values["uneven_leaders"] not in ("auto", "on", "off"):
            raise ValueError(f"uneven_leaders={values['uneven_leaders']!r}: auto, on or off")
        for flag in ("debug", "check_finite"):
            values[flag] = bool(values[flag])
        values["timeout"] = timeout_seconds(self.timeout)
        return dataclasses.replace(self, **values)

    def thresholds(self):
        """{field: bytes} of auto's thresholds, as the C++ communicator takes them."""
        return {field: getattr(self, field) for field in THRESHOLDS}


def _field_type(option):
    return object if option.default is None else type(option.default)


# A field per row of the table, None until resolved.
CommOptions = dataclasses.make_dataclass(
    "CommOptions", [(o.name, _field_type(o), None) for o in OPTIONS], bases=(_Options,),
    frozen=True, namespace={"__doc__": _Options.__doc__, "__module__": __name__})


def _shown(option, value):
    """A default as the table shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if option.name in THRESHOLDS and value == BY_HOST_COUNT:
        return "by host count"
    if isinstance(value, str):
        return f'``"{value}"``'
    if option.name.endswith("_bytes") and value:
        for unit, size in (("MiB", MiB), ("KiB", KiB)):
            if value % size == 0:
                return f"{value // size} {unit}"
        return f"{value} B"
    return str(value)


def table():
    """The options as a markdown table: field, environment variable, default, what it does."""
    rows = ["| field | environment | default | what it does |", "|---|---|---|---|"]
    for option in OPTIONS:
        default = "-" if option.default is None else _shown(option, option.default)
        if option.crowded is not None:
            default += f" ({_shown(option, option.crowded)} when ranks outnumber the cores)"
        rows.append(f"| {option.name} | {option.environment or '-'} | {default} | {option.doc} |")
    return "\n".join(rows) + "\n"


if __doc__:  # not under python -OO
    __doc__ += table()
