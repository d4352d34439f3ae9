"""What torch's ``fp16_compress_hook`` and ``bf16_compress_hook`` compute, for comparing the
accuracy of ringcomm's 16-bit hooks with them without NCCL."""
import torch

from ringcomm.schedule import schedule


def compress_hook_reference(per_rank, dtype):
    """Each rank casts its bucket to ``dtype`` and divides by the world size in 16 bits, then
    the ring sums in 16 bits, rounding at every hop (chunk c starts at rank c+1 and ends at rank
    c, as in ringcomm's schedule). ``per_rank``: (world_size, n) float32; returns float32.

    Example::

        ref = compress_hook_reference(torch.stack(grads), torch.bfloat16)
    """
    n_ranks, n = per_rank.shape
    parts = per_rank.to(dtype).div_(n_ranks)
    out = torch.empty(n, dtype=dtype)
    for c, (offset, count) in enumerate(schedule("all_reduce", n_ranks, n).chunks):
        span = slice(offset, offset + count)
        acc = parts[(c + 1) % n_ranks, span].clone()
        for k in range(2, n_ranks + 1):
            acc = acc + parts[(c + k) % n_ranks, span]
        out[span] = acc
    return out.float()
