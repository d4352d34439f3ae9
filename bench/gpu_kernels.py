"""Reduce-kernel bandwidth against a device-to-device copy of the same bytes (one GPU).

Bandwidth counts every byte moved: a copy reads and writes S bytes (2S); the reduce reads two
S-byte inputs and writes one output (3S). The target is reduce >= 0.9 x copy in those units.

    python bench/gpu_kernels.py --mib 256 --json out.json
"""
import argparse
import json

import torch

from ringcomm import _C, _testing


def time_per_call(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / iters  # seconds per call


def measure(dtype_name, mib, iters, warmup, offset=0):
    dtype = getattr(torch, dtype_name)
    nbytes = mib << 20
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    a = torch.randn(n + 8, device="cuda").to(dtype)
    b = torch.randn(n + 8, device="cuda").to(dtype)
    out = torch.empty(n + 8, device="cuda", dtype=dtype)
    stream = torch.cuda.current_stream().cuda_stream
    size = a.element_size()
    pa, pb, po = (t.data_ptr() + offset * size for t in (a, b, out))
    cdt = getattr(_C.DataType, dtype_name)

    def reduce():
        # The whole GPU, as for the copy it is compared with.
        _testing.reduce_kernel(po, 0, pa, pb, n, cdt, _C.RedOp.sum, 1, False, stream, nccl_sms=0)

    def copy():
        out[:n].copy_(a[:n])

    t_reduce = time_per_call(reduce, iters, warmup)
    t_copy = time_per_call(copy, iters, warmup)
    reduce_bw = 3 * nbytes / t_reduce / 1e9
    copy_bw = 2 * nbytes / t_copy / 1e9
    ref = (a[offset:offset + n].float() + b[offset:offset + n].float()).to(dtype)
    reduce()
    torch.cuda.synchronize()
    correct = bool(torch.equal(out[offset:offset + n], ref))
    return {"dtype": dtype_name, "bytes": nbytes, "offset_elems": offset,
            "reduce_us": t_reduce * 1e6, "copy_us": t_copy * 1e6,
            "reduce_GBps": reduce_bw, "copy_GBps": copy_bw, "ratio": reduce_bw / copy_bw,
            "correct": correct}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for dtype in ("float32", "bfloat16"):
        for offset in (0, 1):  # aligned (vector path) and shifted by one element (same shift)
            row = measure(dtype, args.mib, args.iters, args.warmup, offset)
            rows.append(row)
            print(f"{dtype:9s} off={offset} reduce {row['reduce_GBps']:7.1f} GB/s  copy "
                  f"{row['copy_GBps']:7.1f} GB/s  ratio {row['ratio']:.3f}  correct={row['correct']}",
                  flush=True)
    result = {"device": torch.cuda.get_device_name(), "bandwidth_counts": "reduce 3S, copy 2S",
              "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
