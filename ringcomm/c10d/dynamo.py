"""The torch backend under torch.compile: its methods run as plain Python, never traced."""
import inspect

import torch


def outside_dynamo(*classes):
    """Runs every method of `classes`, and all it calls, as plain Python under torch.compile.

    While a compiled call runs, Dynamo compiles each Python frame that starts on its thread
    outside torch's own files, also frames that torch's C++ starts. Code that Dynamo runs
    untraced there calls the backend from C++: DDP's forward broadcasts its rebuilt bucket order
    and module buffers and waits on the Works, and so do c10d calls at a graph break
    (dist.barrier, dist.broadcast). gloo's methods are C++ and start no frame. Ours, compiled,
    would read attributes of `self`, a ProcessGroup, which Dynamo treats as an opaque object:
    it fails. (A compiled graph runs with Dynamo off, so its functional collectives never hit
    this.) The code is marked "skip it and what it calls", which is what torch.compiler.disable
    does, without the wrapper that costs every call 0.6-0.8 us; torch without that mark gets the
    wrapper."""
    try:
        from torch._C._dynamo.eval_frame import (_FrameAction, _FrameExecStrategy,
                                                 set_code_exec_strategy)
    except ImportError:
        for cls in classes:
            for name, fn in list(vars(cls).items()):
                if inspect.isfunction(fn):
                    setattr(cls, name, torch.compiler.disable(fn))
        return
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for cls in classes:
        for fn in vars(cls).values():
            if inspect.isfunction(fn):
                set_code_exec_strategy(fn.__code__, skip)
