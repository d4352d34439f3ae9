"""ringcomm against the collectives users run today (gloo on CPU, NCCL on GPU), in nccl-tests'
terms.

    python bench/run.py                                  # quick all_reduce sweep, local ranks
    python bench/run.py --nproc 4 -b 8 -e 64M -f 2 --collective all --json r.json --plot r.png
    torchrun --nproc-per-node 8 bench/run.py --device cuda --baseline nccl-ring
    python bench/run.py -b 8 -e 1M --baseline ringcomm-pg  # Communicator vs dist.* on "ringcomm"
    python bench/run.py -b 8 -e 8 --algorithm ring,one_shot  # ringcomm algorithms side by side
    python bench/run.py -b 8 -e 8 --rounds 7 --load 2     # median of 7 rounds, 2 busy processes
    python bench/tune.py --nproc 4                         # every algorithm: thresholds, targets
    python bench/run.py --baseline mpi --collective all   # MPI's collectives, under its mpiexec

Spawns --nproc local ranks itself unless started by torchrun (RANK/WORLD_SIZE in the environment);
--baseline mpi starts them under MPI's mpiexec instead, unless started by one (bench/mpi_world.py).
"""
import argparse
import inspect
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

try:
    import ringcomm
except ImportError:  # run from a source checkout: the package sits next to bench/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import ringcomm

from collectives import COLLECTIVES, DTYPE_ALIASES, DTYPES, TORCH_OPS
from harness import Bench, Impl, Settings
import link_bound
import mpi_world
from machine_load import busy_load, cpu_times
from nccl_table import table_header, table_row
from plots import write_plot
from records import write_json
from sizes import parse_size, sweep
from timers import CopyCeiling, CoreRoundTrip
from ringcomm.options import ALGORITHMS, check_algorithm

BASELINES = ("auto", "gloo", "nccl", "nccl-ring", "ringcomm-pg", "copy", "mpi", "none")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-b", "--minbytes", type=parse_size, default="8", help="smallest size")
    p.add_argument("-e", "--maxbytes", type=parse_size, default="64M",
                   help="largest size (always measured)")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="size multiplier per step")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations first")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds per size, implementations alternating within each; the time is "
                        "the median round's, the spread their interquartile range")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="N busy-looping processes during the run: what a busy machine does")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="validate results")
    p.add_argument("-d", "--datatype", default="float",
                   choices=sorted(DTYPES) + sorted(DTYPE_ALIASES))
    p.add_argument("-o", "--op", default="sum", choices=sorted(TORCH_OPS))
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast/reduce/gather/scatter")
    p.add_argument("--collective", default="all_reduce", type=_collectives,
                   help=f"comma-separated, or 'all': {', '.join(COLLECTIVES)}")
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks to spawn when not under torchrun; None: 2 on CPU, "
                        "one per GPU on CUDA")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--baseline", default="auto", choices=BASELINES,
                   help="auto: nccl on CUDA, gloo on CPU; nccl-ring sets NCCL_ALGO=Ring; "
                        "ringcomm-pg: torch.distributed calls on a \"ringcomm\" process group "
                        "(the cost of the torch layer over the direct Communicator); copy: "
                        "every rank at once reads and rewrites its buffer (in place) or copies "
                        "it (out of place), exchanging nothing: the memory traffic an "
                        "all_reduce cannot avoid, so its busbw is the memory's bound; not "
                        "checked; mpi: MPI's collectives (mpi4py, numpy buffers, CPU), the "
                        "ranks started by its mpiexec (bench/mpi_world.py)")
    p.add_argument("--mpi", default="auto", choices=("auto",) + mpi_world.KINDS,
                   help="--baseline mpi: the MPI whose mpiexec starts the ranks; auto: the one "
                        "beside this interpreter, else on PATH")
    p.add_argument("--json", metavar="PATH", help="write the records as a JSON list")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of busbw against size")
    p.add_argument("--timeout", type=float, default=300, help="ringcomm communicator timeout (s)")
    p.add_argument("--algorithm", type=_algorithms, default=None,
                   help="ringcomm algorithm(s), comma-separated, or 'all', each its own column "
                        f"(ringcomm-NAME); of {', '.join(ALGORITHMS)}; for the collectives whose "
                        "Communicator call takes algorithm= (the others get one 'ringcomm' "
                        "column); default: the communicator's (RINGCOMM_ALGORITHM, else ring)")
    p.add_argument("--link-rate", metavar="RATE",
                   help="the rate hosts are linked at (e.g. 3gbit, tools/emulated_hosts.py "
                        "--rate): print all_reduce's bound over it (bench/link_bound.py)")
    args = p.parse_args(argv)

    args.datatype = DTYPE_ALIASES.get(args.datatype, args.datatype)
    if args.baseline == "mpi":
        if args.device == "cuda":
            p.error("--baseline mpi runs on CPU (MPI on numpy buffers)")
        args.device = "cpu"
        if args.datatype == "bfloat16" or args.op == "avg":
            p.error("--baseline mpi: numpy has no bfloat16 and MPI no avg reduction")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    if args.baseline == "auto":
        args.baseline = "nccl" if args.device == "cuda" else "gloo"
    if args.baseline.startswith("nccl") and args.device != "cuda":
        p.error(f"--baseline {args.baseline} needs --device cuda")
    if args.baseline == "ringcomm-pg" and args.device == "cuda" and not ringcomm.build_info()["cuda"]:
        p.error("--baseline ringcomm-pg on CUDA needs ringcomm built with CUDA")
    if args.op == "avg" and args.baseline == "gloo":
        p.error("gloo has no avg reduction; use --baseline none (or another op)")
    if args.minbytes > args.maxbytes:
        p.error("--minbytes is larger than --maxbytes")
    if args.iters < 1 or args.warmup_iters < 0 or args.rounds < 1:
        p.error("need -n >= 1, -w >= 0 and --rounds >= 1")
    if args.load < 0:
        p.error("--load must be >= 0")
    return args


def _collectives(text):
    names = list(COLLECTIVES) if text == "all" else [t.strip() for t in text.split(",")]
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown collective(s) {unknown}; "
                                         f"choose from {list(COLLECTIVES)} or 'all'")
    return names


def _algorithms(text):
    names = list(ALGORITHMS) if text == "all" else text.split(",")
    for name in names:
        try:
            check_algorithm(name)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return names


def _device(args, rank):
    if args.device == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def takes_algorithm(coll):
    """Whether this build's Communicator call for `coll` takes algorithm= (looked up, not assumed:
    the algorithms reach the collectives one by one)."""
    return "algorithm" in inspect.signature(getattr(ringcomm.Communicator, coll.name)).parameters


def _ringcomm_impls(comm, coll, args, device):
    """ringcomm-NAME per --algorithm where the call takes one and runs it, else one "ringcomm"
    column."""
    def counted():  # the shared-memory and TCP transports count; NCCL's do not
        stats = comm.stats()
        return stats.total_sent + stats.bytes_published

    sent = counted if device.type == "cpu" else None
    run = coll.ringcomm
    if args.algorithm is None or not takes_algorithm(coll):
        if args.baseline == "mpi":  # numpy views, through the plumbing of MPI's own calls
            return [Impl("ringcomm", mpi_world.on_numpy(run, comm, args.op, args.root), sent)]
        return [Impl("ringcomm", lambda c, b: run(comm, b, args.op, args.root), sent)]
    views = mpi_world.numpy_buffers if args.baseline == "mpi" else (lambda b: b)
    return [Impl(f"ringcomm-{name}",
                 lambda c, b, name=name: run(comm, views(b), args.op, args.root, algorithm=name),
                 sent)
            for name in args.algorithm if _runs(comm, coll, name, args, device)]


def copy_bound():
    """A run call that does what each rank's memory must at least do: in place, read the buffer
    and write it back (times 1); else copy the output-sized buffer into a scratch of its own
    (kept per size, so nothing is allocated in the timed calls)."""
    scratch = {}

    def run(coll, bufs):
        out = bufs.recv
        if bufs.send is out:
            out.logical_and_(out) if out.dtype == torch.bool else out.mul_(1)
            return
        if out.shape not in scratch:
            scratch.clear()
            scratch[out.shape] = torch.empty_like(out)
        scratch[out.shape].copy_(out)
    return run


def _runs(comm, coll, name, args, device):
    """Whether `comm` runs `coll` with algorithm `name`, tried on a tiny buffer: a refusal (an
    algorithm not planned for this collective) is an argument check, the same on every rank, and
    leaves the communicator usable. Said once; the sweep goes on without it."""
    bufs = coll.allocate(1, comm.world_size, comm.rank, DTYPES[args.datatype], device,
                         inplace=False)
    bufs.send.zero_()
    try:
        coll.ringcomm(comm, bufs, args.op, args.root, algorithm=name)
        return True
    except (ringcomm.CommTimeoutError, ringcomm.PeerError, ringcomm.MismatchError):
        raise  # a failure, not a refusal
    except (ringcomm.RingcommError, ValueError, NotImplementedError) as error:
        if comm.rank == 0:
            print(f"# {coll.name}: ringcomm refuses algorithm {name} ({error}): left out",
                  flush=True)
        return False


def _share_gpu(rank, ranks_on_gpu):
    """More ranks than GPUs: NCCL refuses two ranks on one GPU unless told (docs/design.md)."""
    major, minor, patch = torch.cuda.nccl.version()[:3]  # the one ringcomm loads too
    env = ringcomm.transport.cuda.shared_gpu_env(rank, ranks_on_gpu,
                                                 major * 10000 + minor * 100 + patch)
    for name, value in env.items():
        os.environ.setdefault(name, value)


def worker(rank, world, args, init_method):
    """One rank: set up both implementations, run every requested collective, report on rank 0."""
    if args.baseline == "nccl-ring":
        os.environ["NCCL_ALGO"] = "Ring"  # read when NCCL creates its communicator, below
    device = _device(args, rank)
    if device.type == "cuda" and world > torch.cuda.device_count():
        _share_gpu(rank, -(-world // torch.cuda.device_count()))
    backend = "nccl" if args.baseline.startswith("nccl") else "gloo"  # ringcomm-pg: a subgroup
    eager = {"device_id": device} if backend == "nccl" else {}  # NCCL set up now, env as above
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            **eager)
    # Barriers and result gathering get their own gloo group: never queued behind the baseline.
    ctl = dist.new_group(backend="gloo")
    if not 0 <= args.root < world:
        raise SystemExit(f"--root {args.root} is not a rank of {world}")
    ceiling = round_trip = None
    # Before any communicator: one may pin this thread and the threads it starts to a share of
    # the cores, and the copy's thread pool must have them all.
    if rank == 0:  # alone on the machine while the others wait, so the figure is clean
        ceiling = CopyCeiling(device)
        ceiling.sample(reps=5)
        threads = f", {ceiling.threads} threads" if device.type == "cpu" else ""
        print(f"# memcpy ceiling (torch copy_ of 64 MiB on {device.type}{threads}): "
              f"{ceiling.median():.2f} GB/s; sampled again after every round", flush=True)
        if device.type == "cpu":
            round_trip = CoreRoundTrip(world)
            round_trip.sample()
            print(f"# core-to-core round trip: {round_trip.describe()}; also after every round",
                  flush=True)
        if args.link_rate:
            # torchrun's node count (hosts may run different numbers of ranks)
            hosts = int(os.environ.get("GROUP_WORLD_SIZE") or
                        world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
            print(link_bound.describe(args.link_rate, hosts, world), flush=True)
        if args.baseline == "mpi":
            print(mpi_world.describe(), flush=True)
        print("#", flush=True)
    dist.barrier(group=ctl)
    comm = None  # None where this build cannot run on the device (said once, not fatal)
    if device.type != "cuda" or ringcomm.build_info()["cuda"]:
        comm = ringcomm.Communicator(timeout=args.timeout)
    elif rank == 0:
        print("# ringcomm skipped: this build has no CUDA path (built without nvcc)", flush=True)
    baseline = []
    if args.baseline == "copy":
        baseline.append(Impl("copy", copy_bound(), checked=False))
    elif args.baseline not in ("none", "mpi"):  # mpi: per collective, below
        op = TORCH_OPS[args.op]
        # The backend path: the same torch.distributed calls, on a process group run by ringcomm.
        group = dist.new_group(backend="ringcomm") if args.baseline == "ringcomm-pg" else None
        baseline.append(Impl(args.baseline, lambda c, b: c.torch(b, op, args.root, group)))
    if comm is None and not baseline:
        raise SystemExit("nothing to measure: ringcomm cannot run here and --baseline is none")

    if device.type == "cpu":
        # One intra-op thread per rank, as torchrun sets for several local ranks: N ranks' thread
        # pools oversubscribe the cores, and their idle workers spin on the cores both
        # implementations need (a 16 MiB all_reduce at 4 ranks measured up to 2.7x slower).
        torch.set_num_threads(1)

    settings = Settings(args.iters, args.warmup_iters, bool(args.check), args.op,
                                args.root, args.datatype, args.rounds)
    def sample_machine():  # every rank waits while rank 0 copies and times the round trip
        dist.barrier(group=ctl)
        if ceiling:
            ceiling.sample()
        if round_trip:
            round_trip.sample()
        dist.barrier(group=ctl)

    bench = Bench(rank, world, device, ctl, settings, between_rounds=sample_machine)
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    records = []
    for name in args.collective:
        coll = COLLECTIVES[name]
        impls = (_ringcomm_impls(comm, coll, args, device) if comm else []) + baseline
        if args.baseline == "mpi":
            impls += [i for i in [mpi_world.impl(coll, args)] if i]
        names = [i.name for i in impls]
        if rank == 0:
            print(table_header(names, _title(coll, args, world, device)),
                  flush=True)
        rows = bench.run(coll, impls, sizes, on_row=lambda row: print(
            table_row(row, names), flush=True))
        records += rows
        if rank == 0:
            print(_summary(rows, names, ceiling, round_trip) + "\n", flush=True)

    if rank == 0 and args.report:  # the caller's analysis writes its own files
        args.report(records, world, args)
    elif rank == 0:
        if args.json:
            write_json(args.json, records)
        if args.plot:
            write_plot(args.plot, records, f"{world} ranks, {device.type}, "
                                                   f"{args.datatype}")
    if comm:
        comm.close()
    dist.destroy_process_group()


def _title(coll, args, world, device):
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{os.cpu_count()} CPU cores"
    lines = [f"ringcomm bench: {coll.name}, {world} ranks on {where}; type {args.datatype}, "
             f"op {args.op}, root {args.root}; iters {args.iters}, warmup {args.warmup_iters}, "
             f"check {args.check}; baseline {args.baseline}"
             + (f"; {args.load} busy processes beside" if args.load else ""),
             "time: slowest rank's mean over the timed iterations"
             + (f", median of {args.rounds} interleaved rounds" if args.rounds > 1 else "")
             + "; GB = 1e9 bytes"]
    if coll.in_place_only:
        lines.append(f"{coll.name} is in place in ringcomm and torch.distributed: out-of-place "
                     "is N/A")
    return lines


def _summary(rows, names, ceiling, round_trip):
    """nccl-tests' closing 'Avg bus bandwidth' line, per implementation; then the memcpy
    ceiling's samples so far and each implementation's busbw at the largest size against their
    median; on CPU the core-to-core round trips so far."""
    parts = []
    for name in names:
        bw = [r["busbw"] for r in rows if r["impl"] == name]
        parts.append(f"{name} {sum(bw) / len(bw):.3f}")
    line = "# avg busbw (GB/s): " + ", ".join(parts)
    largest = max(r["size"] for r in rows)
    top = {r["impl"]: r["busbw"] for r in rows if r["size"] == largest}  # in place, if measured
    ratios = ", ".join(f"{name} {top[name] / ceiling.median():.3g}" for name in names)
    return (line + f"\n# memcpy ceiling: median {ceiling.median():.2f} GB/s of "
            f"{len(ceiling.samples)} copies ({min(ceiling.samples):.2f}-"
            f"{max(ceiling.samples):.2f}); busbw at {largest} B / ceiling: {ratios}"
            + (f"\n# core-to-core round trip: {round_trip.describe()}" if round_trip else ""))


def _spawned(index, world, args, init_method):
    worker(index, world, args, init_method)


def main(argv=None, report=None):
    """Runs the benchmark; `report(records, world, args)`, if given, runs on rank 0 at the end
    instead of the JSON and plot writers (bench/tune.py's analysis)."""
    args = parse_args(argv)
    args.report = report
    # How busy the machine was before we start, and its CPU time from here on (rank 0 reports).
    args.loadavg = os.getloadavg()
    if args.baseline == "mpi" and mpi_world.under_mpi():  # env:// from MPI's world, below
        mpi_world.rendezvous()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun (or mpiexec) started us
        if args.load:
            raise SystemExit("run.py: error: --load needs run.py to start the ranks itself")
        if args.baseline == "mpi" and not mpi_world.under_mpi():
            raise SystemExit("run.py: error: --baseline mpi: ranks started by mpiexec or run.py")
        args.cpu_before = cpu_times()
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return
    world = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if not 0 <= args.root < world:
        raise SystemExit(f"run.py: error: --root {args.root} is not a rank of {world}")
    if args.baseline == "mpi":  # the ranks started by MPI's mpiexec, running this script
        code = mpi_world.relaunch(args, sys.argv[1:] if argv is None else list(argv), world,
                                  Path(__file__).resolve())
        if code:
            raise SystemExit(code)
        return
    with tempfile.TemporaryDirectory(prefix="ringcomm-bench-") as tmp, busy_load(args.load):
        args.cpu_before = cpu_times()
        # fork starts in a fraction of a second; CUDA cannot survive a fork, so spawn there.
        torch.multiprocessing.start_processes(
            _spawned, args=(world, args, f"file://{tmp}/store"), nprocs=world, join=True,
            start_method="spawn" if args.device == "cuda" else "fork")


if __name__ == "__main__":
    main()
