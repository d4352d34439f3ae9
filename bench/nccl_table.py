"""The printed table in nccl-tests' columns: size, count, type, redop, root, then per
implementation time, algbw, busbw and #wrong out of place and in place, the busbw ratio of the
first implementation to the last, each implementation's per-call p50 and p99, and the bytes the
first implementation sent or published per byte of the size (where it counts them; ring
all_reduce: 2(N-1)/N)."""

_KEY = "{:>12} {:>13} {:>9} {:>6} {:>5}"
_BLOCK = " {:>9} {:>7} {:>7} {:>6}"
_TAIL = " {:>9} {:>9}"
_MOVED = " {:>7}"


def table_header(impl_names, title_lines):
    """nccl-tests' header: key columns, then (out-of-place, in-place) per implementation, then
    the ratio of the first implementation's busbw to the last's, then each implementation's
    per-call median and 99th percentile (in place where measured, else out of place)."""
    lines = [f"# {line}" for line in title_lines] + ["#"]
    width = len(_BLOCK.format("", "", "", ""))
    blocks = "".join(f"{name + ': out-of-place':>{width}}{'in-place':>{width}}" for name in impl_names)
    ratio = f"  {impl_names[0]}/{impl_names[-1]} busbw" if len(impl_names) > 1 else ""
    tail_width = len(_TAIL.format("", ""))
    tails = "".join(f"{name + ': per call':>{tail_width}}" for name in impl_names)
    lines.append("#" + " " * 49 + blocks + ratio + tails + f"  {impl_names[0]}")
    cols = _BLOCK.format("time", "algbw", "busbw", "#wrong") * 2 * len(impl_names)
    units = _BLOCK.format("(us)", "(GB/s)", "(GB/s)", "") * 2 * len(impl_names)
    ratio_cols = "   oop     ip" if ratio else ""
    lines.append("#" + _KEY.format("size", "count", "type", "redop", "root")[1:] + cols
                 + ratio_cols + _TAIL.format("p50", "p99") * len(impl_names)
                 + _MOVED.format("moved"))
    lines.append("#" + _KEY.format("(B)", "(elements)", "", "", "")[1:] + units
                 + " " * len(ratio_cols) + _TAIL.format("(us)", "(us)") * len(impl_names)
                 + _MOVED.format("(B/B)"))
    return "\n".join(lines)


def table_row(records, impl_names):
    """One line from one size's records (any order); N/A where a variant was not measured."""
    by = {(r["impl"], r["inplace"]): r for r in records}
    first = records[0]
    line = _KEY.format(first["size"], first["count"], first["type"], first["redop"], first["root"])
    for name in impl_names:
        for inplace in (False, True):
            r = by.get((name, inplace))
            if r is None:
                line += _BLOCK.format("N/A", "N/A", "N/A", "N/A")
            else:
                wrong = "N/A" if r["wrong"] is None else r["wrong"]
                line += _BLOCK.format(_time_text(r["time_us"]), f"{r['algbw']:.2f}",
                                      f"{r['busbw']:.2f}", wrong)
    if len(impl_names) > 1:
        for inplace in (False, True):
            a, b = by.get((impl_names[0], inplace)), by.get((impl_names[-1], inplace))
            # Same size and factor, so the busbw ratio is the time ratio (defined even when n = 1).
            line += f" {b['time_us'] / a['time_us']:6.2f}" if a and b else f" {'N/A':>6}"
    for name in impl_names:
        r = by.get((name, True)) or by.get((name, False))
        line += _TAIL.format(_time_text(r["p50_us"]), _time_text(r["p99_us"])) if r and \
            "p50_us" in r else _TAIL.format("N/A", "N/A")
    r = by.get((impl_names[0], True)) or by.get((impl_names[0], False))
    moved = r.get("moved_per_byte") if r else None
    return line + _MOVED.format("N/A" if moved is None else f"{moved:.2f}")


def _time_text(us):
    """Fixed width like nccl-tests: fewer decimals as the time grows."""
    return f"{us:.2f}" if us < 1e4 else f"{us:.1f}" if us < 1e5 else f"{us:.0f}"
