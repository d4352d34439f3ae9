"""Host calls per all_reduce on the CUDA path: how many NCCL groups (each ncclGroupEnd of a
non-blocking communicator starts a thread in NCCL), kernel launches and CUDA/NCCL calls one
all_reduce makes in steady state (the same buffers again, as DDP's buckets), per rank. Counted
by running the NcclTransport and CudaReducer that ship over the host implementation of CUDA and
NCCL (ranks as threads, kernels executed on the CPU), so it needs no GPU; on a GPU,
bench/gpu_allreduce.py measures what these calls cost in microseconds.

    python bench/gpu_host_calls.py --world 2 8 --mib 1 16 256 --slice-mib 4 [--no-cuda-graphs]
"""
import argparse
import threading

import torch

from ringcomm import _C, _testing
from ringcomm.options import DEFAULTS

host_gpu = _testing.host_gpu
# Left out of the call count: the watchdog's polls (as many as time allows, on its own thread;
# a NotReady poll's cudaGetLastError too) and this script's own synchronize.
POLLS = {"cudaEventQuery", "ncclCommGetAsyncError", "cudaGetLastError", "cudaStreamSynchronize"}


def counts_per_call(world, mib, slice_mib, calls=2, cuda_graphs=True):
    """{call name: count} per rank and all_reduce in steady state: after three calls (the first
    connects, the second is recorded when cuda_graphs is on, the third replayed)."""
    uid, slice_bytes = host_gpu.unique_id(), slice_mib << 20
    count = (mib << 20) // 4
    barrier, errors, counted = threading.Barrier(world), [], {}

    def rank_main(rank):
        try:
            ring = host_gpu.TransportAndReducer(rank, world, uid, slice_bytes=slice_bytes,
                                 slots=DEFAULTS["cuda_slot_count"], publish_bytes=0, timeout=300,
                                 cuda_graphs=cuda_graphs, nccl_sms=DEFAULTS["nccl_sms"])
            comm = _C.Communicator(rank, world, ring.transport, ring.reducer, slice_bytes)
            buf = torch.ones(count)
            # Tagged, as a DDP bucket's: recorded when cuda_graphs is on.
            request = _C.CollectiveRequest(_C.Collective.all_reduce, buf.data_ptr(), 0, count,
                                           _C.DataType.float32, _C.RedOp.sum, replay_tag=0)
            for _ in range(3):
                comm.run(request)
            host_gpu.synchronize_caller()
            if barrier.wait() == 0:
                host_gpu.reset()
            barrier.wait()
            for _ in range(calls):
                comm.run(request)
            host_gpu.synchronize_caller()
            if barrier.wait() == 0:
                counted.update(host_gpu.calls())
                counted["kernel launches"] = host_gpu.grid_stats()["launches"]
            barrier.wait()
            comm.close()
        except Exception as error:  # reported below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {name: n / (world * calls) for name, n in counted.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--mib", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--slice-mib", type=int, default=DEFAULTS["cuda_slice_bytes"] >> 20,
                        help="cuda_slice_bytes in MiB")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="every call eager (the cuda_graphs option off)")
    args = parser.parse_args()
    print(f"{'world':>5} {'MiB':>5} {'groups':>7} {'kernels':>8} {'event ops':>10} "
          f"{'other calls':>12}   (per rank and all_reduce, slice {args.slice_mib} MiB, "
          f"cuda_graphs {'on' if args.cuda_graphs else 'off'})")
    for world in args.world:
        for mib in args.mib:
            c = counts_per_call(world, mib, args.slice_mib, cuda_graphs=args.cuda_graphs)
            events = sum(v for k, v in c.items() if k.startswith(("cudaEventRecord",
                                                                   "cudaStreamWaitEvent")))
            calls = sum(v for k, v in c.items()
                        if k.startswith(("cuda", "nccl")) and k not in POLLS)
            print(f"{world:>5} {mib:>5} {c.get('ncclGroupEnd', 0):>7.0f} "
                  f"{c['kernel launches']:>8.0f} {events:>10.0f} {calls - events:>12.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
