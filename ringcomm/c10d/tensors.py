"""Tensor helpers of the torch backend: the flat, contiguous buffers ringcomm runs on made from
and copied back into what torch.distributed passes (lists, strided views)."""
import torch


def concatenated(tensors):
    """One contiguous tensor holding `tensors` back to back."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unflatten_into(flat, tensors):
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class Contiguous:
    """A contiguous stand-in for `tensor`, copied back on exit when it had to be a copy."""

    def __init__(self, tensor, write_back=True):
        self.tensor, self.write_back = tensor, write_back
        self.buffer = tensor if tensor.is_contiguous() else tensor.contiguous()

    def __enter__(self):
        return self.buffer

    def __exit__(self, *exc):
        if self.buffer is not self.tensor and self.write_back and exc[0] is None:
            self.tensor.copy_(self.buffer)
