"""The backend for CUDA buffers ("nccl"): ringcomm's ring over its own NCCL communicator
(send/recv only); the same NCCL communicator reaches every rank, so it also carries
point-to-point and all-to-all."""
import os
import sys

from .. import _C
from ..observe.log import logger
from ..options import DEFAULTS, CommOptions


def nccl_library_hint():
    """The nvidia-nccl-cu13 wheel's lib folder, if installed: NCCL is loaded at run time from the
    library torch already loaded, else the system's, else this (the nccl_library option wins)."""
    try:
        import nvidia.nccl

        return os.path.join(list(nvidia.nccl.__path__)[0], "lib")
    except ImportError:
        return ""


def nccl_search(options=None):
    """Where NCCL is looked for, as the keywords of _C.nccl_library and _C.nccl_unique_id: the
    nccl_library option (of `options`, else the environment) and the wheel's folder."""
    options = options if options is not None else CommOptions().resolved(1)
    return {"library": options.nccl_library, "hint": nccl_library_hint()}


# NCCL_MULTI_RANK_GPU_ENABLE exists from NCCL 2.30.3 (version code 23003); 2.30.0-2.30.2 refuse
# a second rank on a device like older releases do. It allows at most 2 ranks per device.
MULTI_RANK_GPU_NCCL = 23003
MULTI_RANK_GPU_MAX_RANKS = 2


# What every rank sharing a GPU also gets, on either path. NVLS (NVLink SHARP) and multi-node
# NVLink would have NCCL set up multicast and fabric memory between "hosts" that are one device;
# ringcomm only sends and receives, so it needs neither. The ranks time-slice the one GPU, so
# each communicator's NCCL kernels use few CTAs (as many as the SMs nccl_sms leaves them).
SHARED_GPU_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0",
                       "NCCL_MAX_CTAS": str(DEFAULTS["nccl_sms"])}


def shared_gpu_env(rank, ranks_on_gpu, nccl_version=None, environ=None):
    """Environment variables that let `ranks_on_gpu` ranks share one GPU; set them before NCCL
    creates a communicator. NCCL >= 2.30.3 allows 2 when asked; older NCCL, or more ranks, are
    refused ("Duplicate GPU detected") unless each rank looks like its own host, and then talk
    over loopback sockets.
    What the user already set (in `environ`, default os.environ) is kept, except that a rank's
    NCCL_HOSTID must differ from its neighbours': a user's value gets the rank appended.
    nccl_version: the version code of the NCCL that will run (default: the one ringcomm loads)."""
    environ = os.environ if environ is None else environ
    if nccl_version is None:
        nccl_version = _C.nccl_library(**nccl_search())[1]
    multi_rank = nccl_version >= MULTI_RANK_GPU_NCCL and ranks_on_gpu <= MULTI_RANK_GPU_MAX_RANKS
    if multi_rank:
        wanted = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    else:
        # Sockets over loopback, not whatever InfiniBand the machine has: the path taken is known.
        wanted = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}
    wanted.update(SHARED_GPU_DEFAULTS)
    env = {name: environ.get(name, value) for name, value in wanted.items()}
    if not multi_rank:
        env["NCCL_HOSTID"] = f"{environ.get('NCCL_HOSTID', 'ringcomm')}-rank-{rank}"
    return env


def available():
    return bool(_C.build_info()["cuda"]) and _C.cuda_available()


def create(rendezvous, device_index, options, ordinal=0):
    """A _C.Communicator over a _C.CudaTransportAndReducer on `device_index`, configured by resolved
    CommOptions; every rank of the group calls this together.

    The NCCL id is published under this communicator's rendezvous prefix and `ordinal` (the
    how-manieth CUDA backend of the communicator, 0 for the usual one device per rank), never
    under a device index: on a multi-GPU node rank r uses device r, and all read rank 0's id."""
    if not _C.build_info()["cuda"]:
        raise _C.RingcommError("this ringcomm was built without CUDA (no nvcc at build time); "
                               "reinstall it on a machine with the CUDA toolkit")
    if not _C.cuda_available():
        raise _C.RingcommError("CUDA tensors were given but no CUDA device is usable: "
                               + _C.cuda_unavailable_reason())
    if _capturing():
        raise _C.RingcommError(
            "a CUDA graph capture cannot hold a ringcomm communicator's first CUDA call, which "
            "creates its NCCL communicator and memory: run a collective once before capturing, "
            "as a warm-up")
    search = nccl_search(options)
    key = f"nccl-id/{ordinal}"
    if rendezvous.rank == 0:
        rendezvous.publish(key, _C.nccl_unique_id(**search))
    unique_id = rendezvous.read(key, 0)
    arguments = ring_arguments(options)
    ring = _C.CudaTransportAndReducer(rendezvous.rank, rendezvous.world_size, device_index, unique_id,
                       **arguments)
    comm = _C.Communicator(rendezvous.rank, rendezvous.world_size, ring.transport, ring.reducer,
                           arguments["slice_bytes"])
    comm.set_peer_links(ring.transport)  # sends whole messages from and into user buffers
    comm.set_trace_buffer(options.trace_buffer)
    ring.release()  # the communicator owns them now: its close() frees the GPU resources
    return comm


def ring_arguments(options, publish_bytes=0):
    """_C.CudaTransportAndReducer's keywords after the device and NCCL id, from resolved CommOptions.
    publish_bytes: 0 offers the ring only. The one-hop algorithms over NCCL have not yet run on
    a GPU, so communicators leave them off; the GPU tests pass a size to run them."""
    search = nccl_search(options)
    return {"slice_bytes": options.slice_bytes or options.cuda_slice_bytes,
            "slots": options.cuda_slot_count, "timeout": options.timeout,
            "library_hint": search["hint"], "library": search["library"],
            "nccl_sms": options.nccl_sms, "publish_bytes": publish_bytes,
            "cuda_graphs": graphs_wanted(options.cuda_graphs)}


# Replay runs recorded and eager NCCL work on one communicator: NCCL's graph mixing, which
# either of these set to 0 turns off.
GRAPH_MIXING = ("NCCL_GRAPH_MIXING_SUPPORT", "NCCL_GRAPH_STREAM_ORDERING")


def graphs_wanted(cuda_graphs, environ=None):
    """Whether ringcomm records and replays collectives (the cuda_graphs option), set before its
    NCCL communicator is made. Off where NCCL's graph mixing is off. On, it sets
    NCCL_GRAPH_REGISTER=0 unless the user set it: inside a capture NCCL registers the buffers of
    its point-to-point calls, which changes their protocol; without registration a recorded
    call moves its data as an eager one does. NCCL reads it once per process, so it also
    applies to torch's NCCL communicators made later."""
    environ = os.environ if environ is None else environ
    if not cuda_graphs:
        return False
    off = [name for name in GRAPH_MIXING if environ.get(name, "").strip() == "0"]
    if off:
        logger.info("cuda_graphs off: %s=0 turns off NCCL's graph mixing, which replay needs",
                    "=0, ".join(off))
        return False
    environ.setdefault("NCCL_GRAPH_REGISTER", "0")
    logger.info("cuda_graphs on: NCCL_GRAPH_REGISTER=%s", environ["NCCL_GRAPH_REGISTER"])
    return True


def _capturing():
    """Whether torch's current stream is capturing a CUDA graph (only asked when torch is in use)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def current_stream(buf):
    """The caller's current stream for the buffer's device, as an integer handle."""
    if buf.source.__class__.__module__.startswith("cupy"):
        import cupy

        return cupy.cuda.get_current_stream().ptr
    import torch

    return torch.cuda.current_stream(buf.device_index).cuda_stream

