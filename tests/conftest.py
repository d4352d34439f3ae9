import os
import signal
import sys

import pytest

# Tests run against the checkout (an in-place build) or an installed ringcomm; the helpers they
# share (launcher, sweeps, jobs run by torchrun) live in tests/support/.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))

from shm_leaks import nothing_left_in_dev_shm  # noqa: E402,F401  (a fixture for every test file)

# A runner started in the background of a script ignores SIGINT, and so would every rank it
# starts: the tests of Ctrl-C need Python's own handler, in this process and in the ranks.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _cuda_ready():
    try:
        import torch

        import ringcomm
    except ImportError:
        return False
    return ringcomm.build_info()["cuda"] and torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ready():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and ringcomm built with CUDA")
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            item.add_marker(skip)
