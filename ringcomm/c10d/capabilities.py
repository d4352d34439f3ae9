"""What the installed torch can take from a backend written in Python."""
from torch._C import _distributed_c10d as c10d


def _python_backends():
    """Whether this torch builds a c10d Backend written in Python (torch >= 2.14)."""
    class Probe(c10d.Backend):
        def getBackendName(self):
            return "probe"

    try:
        Probe(0, 1)
        return True
    except (TypeError, RuntimeError):  # "No constructor defined"
        return False


BACKEND_PER_DEVICE = _python_backends()
