"""The benchmark's PNG: busbw and per-call time against size, one panel per collective; and the
size axis and figure saving the other plots share."""
from sizes import format_size


def write_plot(path, records, title):
    """One panel per collective: busbw against size, log-x, one line per implementation and
    variant; below it, each implementation's per-call median (solid) and 99th percentile
    (dotted) time."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(r["collective"] for r in records))
    fig, axes = plt.subplots(2, len(colls), figsize=(6 * len(colls), 8), squeeze=False)
    for ax, tails, coll in zip(axes[0], axes[1], colls):
        mine = [r for r in records if r["collective"] == coll]
        for color, impl in enumerate(dict.fromkeys(r["impl"] for r in mine)):
            for inplace in (False, True):
                pts = sorted((r["size"], r["busbw"], r.get("p50_us"), r.get("p99_us"))
                             for r in mine if r["impl"] == impl and r["inplace"] == inplace)
                if not pts:
                    continue
                variant = "in-place" if inplace else "out-of-place"
                sizes = [p[0] for p in pts]
                ax.plot(sizes, [p[1] for p in pts], marker="o", ms=3, color=f"C{color}",
                        linestyle="-" if inplace else "--", label=f"{impl} ({variant})")
                if pts[0][2] is not None and (inplace or not any(
                        r["inplace"] for r in mine if r["impl"] == impl)):
                    tails.plot(sizes, [p[2] for p in pts], marker="o", ms=3, color=f"C{color}",
                               label=f"{impl} p50")
                    tails.plot(sizes, [p[3] for p in pts], marker=".", color=f"C{color}",
                               linestyle=":", label=f"{impl} p99")
        ax.set(title=coll, xlabel="size (bytes)", ylabel="busbw (GB/s)")
        size_axis(ax)
        tails.set(yscale="log", xlabel="size (bytes)", ylabel="time per call (us)")
        size_axis(tails)
    save_figure(fig, path, title)


def size_axis(ax):
    """A log2 size axis labelled 8, 1K, 64M, a grid and the legend."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def save_figure(fig, path, title):
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
