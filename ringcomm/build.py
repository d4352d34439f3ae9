"""How this ringcomm was built, as the compiled core reports it."""
from . import _C


def build_info():
    """How this ringcomm was built: ``{"cuda": bool, "cuda_archs": [...], "nccl_version": str|None}``.

    Example::

        >>> ringcomm.build_info()["cuda"]
        True
    """
    info = dict(_C.build_info())
    csv = info.pop("cuda_archs_csv")
    info["cuda_archs"] = [a for a in csv.split(",") if a]
    return info
