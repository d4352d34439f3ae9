"""ringcomm ring allreduce busbw against torch.distributed's NCCL all_reduce, ranks sharing GPU 0.

busbw = S / t x 2(n-1)/n (nccl-tests). Same ranks, sizes, dtype and stream for both. Each slice
size runs twice: "eager" (every call enqueues its NCCL groups and kernels; the host cost is per
receive) and "replayed" (tagged: recorded at its second call, one graph launch per call after).

    python bench/gpu_allreduce.py --world 2 --mib 64 256 --slices-mib 1 4 16 32 --json out.json
"""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpu_kernels import time_per_call


def _time(fn, iters, warmup):
    """Seconds per call, timed with CUDA events once every rank has warmed up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier(device_ids=[0])
    return time_per_call(fn, iters, warmup=0)


def _host_time(fn, iters):
    """Seconds the host spends in one call (enqueueing its NCCL groups and kernels), after a
    synchronize: the per-step host cost the GPU work has to hide."""
    torch.cuda.synchronize()
    dist.barrier(device_ids=[0])
    spent = 0.0
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        spent += time.perf_counter() - start
    torch.cuda.synchronize()
    return spent / iters


def _rank(rank, world, store_path, sizes_mib, iters, warmup, slices, out_path):
    from ringcomm import _C, CommOptions, _testing
    from ringcomm.transport import cuda as cuda_backend

    os.environ.update(cuda_backend.shared_gpu_env(rank, world))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", 0))
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("ringcomm-bench-id", _C.nccl_unique_id(**cuda_backend.nccl_search()))
    # Slots as large as the largest slice; each measurement sets the slice it wants.
    # A short timeout: a hang costs the check seconds and still reports the rows before it.
    options = CommOptions(timeout=20.0, slice_bytes=max(slices)).resolved(world)
    ring = _C.CudaTransportAndReducer(rank, world, 0, store.get("ringcomm-bench-id"),
                       **cuda_backend.ring_arguments(options))
    comm = _C.Communicator(rank, world, ring.transport, ring.reducer, max(slices))
    ring.release()
    rows = []
    factor = 2 * (world - 1) / world
    stream = torch.cuda.current_stream().cuda_stream
    for mib in sizes_mib:
        n = (mib << 20) // 4
        x = torch.full((n,), float(rank + 1), device="cuda")

        def runner(tag):
            # Tagged: recorded at its second call (per slice size), replayed from then on.
            request = _C.CollectiveRequest(_C.Collective.all_reduce, x.data_ptr(), 0, n,
                                           _C.DataType.float32, _C.RedOp.sum, stream=stream,
                                           replay_tag=tag)
            return lambda: comm.run(request)

        def theirs():
            dist.all_reduce(x)

        t_nccl = _time(theirs, iters, warmup)
        for slice_bytes in slices:
            comm.slice_bytes = slice_bytes
            for mode, ours in (("eager", runner(-1)), ("replayed", runner(0))):
                t_ours = _time(ours, iters, warmup)
                host = _host_time(ours, iters)
                # Eager: one NCCL group per receive, 2(n-1) steps of `columns` slices each.
                columns = _testing.column_count(_C.Collective.all_reduce, world, n,
                                                slice_bytes // 4)
                receives = 2 * (world - 1) * columns
                x.fill_(float(rank + 1))
                ours()
                torch.cuda.synchronize()
                correct = bool(torch.all(x == world * (world + 1) / 2))
                per_receive = host * 1e6 / max(receives, 1) if mode == "eager" else None
                rows.append({"world": world, "bytes": mib << 20, "dtype": "float32",
                             "slice_bytes": slice_bytes, "mode": mode,
                             "ringcomm_us": t_ours * 1e6, "nccl_us": t_nccl * 1e6,
                             "ringcomm_busbw_GBps": (mib << 20) / t_ours / 1e9 * factor,
                             "nccl_busbw_GBps": (mib << 20) / t_nccl / 1e9 * factor,
                             "ratio": t_nccl / t_ours, "correct": correct,
                             "host_us": host * 1e6, "receives": receives,
                             "host_us_per_receive": per_receive})
                if rank == 0:
                    r = rows[-1]
                    host_text = (f"{per_receive:.1f} us/receive" if per_receive is not None
                                 else f"{r['host_us']:.1f} us/launch")
                    print(f"world {world} {mib:5d} MiB slice {slice_bytes >> 20:3d} MiB {mode:8s}"
                          f" ringcomm {r['ringcomm_busbw_GBps']:7.1f} GB/s  nccl "
                          f"{r['nccl_busbw_GBps']:7.1f} GB/s  ratio {r['ratio']:.3f}  host "
                          f"{host_text}  correct={correct}", flush=True)
                    if out_path:  # after every row: a run cut short still reports
                        with open(out_path, "w") as f:
                            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f,
                                      indent=1)
    comm.close()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--slices-mib", type=int, nargs="+", default=[4],
                        help="ringcomm slice sizes to measure (one NCCL baseline per size)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, nprocs=args.world, join=True,
                 args=(args.world, os.path.join(tmp, "store"), args.mib, args.iters,
                       args.warmup, [m << 20 for m in args.slices_mib], args.json))


if __name__ == "__main__":
    main()
