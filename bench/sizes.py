"""Message sizes as nccl-tests writes them (8, 1K, 64M: powers of 1024) and the size sweep."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'8', '1K', '64M', '1G' (powers of 1024, like nccl-tests) -> bytes."""
    text = str(text).strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        value = int(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"bad size {text!r}: use a number with an optional K, M or G") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def format_size(nbytes):
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def sweep(minbytes, maxbytes, factor):
    """minbytes, minbytes*factor, ... <= maxbytes, and maxbytes itself (so -e is always measured)."""
    if factor < 2:
        raise ValueError("stepfactor must be >= 2")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    if not sizes or sizes[-1] != maxbytes:
        sizes.append(maxbytes)
    return sizes
