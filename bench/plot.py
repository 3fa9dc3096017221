#!/usr/bin/python3
"""Draws sneppx-bench's CSV as a PNG: GFLOP/s against T, one panel per stage
case (projections, attention, each model's layer), one line per
implementation and thread count, with the measured FMA peak as dashed lines.

    plot.py RESULTS.csv CHART.png
"""
import csv
import sys
from collections import defaultdict


STAGE_ORDER = ("gemm", "attention", "layer")
STAGE_TITLES = {"gemm": "projection ", "attention": "attention ", "layer": "layer "}
# The attention stage records the causal flash row again, under these names, as the
# baseline of its window and explicit-mask rows: a copy, not another implementation.
BASELINE_COPIES = ("causal", "no-win")


def load(path):
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f)]


def panels_of(rows):
    """{(stage order, panel title): {line label: [(T, rate, rate_min, rate_max)]}} for the GFLOP/s rows."""
    panels = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["stage"] not in ("gemm", "attention", "layer") or row["unit"] != "GFLOP/s":
            continue
        if row["impl"] in BASELINE_COPIES or " w" in row["case"]:  # the window comparison is one point
            continue
        title = (STAGE_ORDER.index(row["stage"]), STAGE_TITLES[row["stage"]] + row["case"])
        label = f'{row["impl"]} {row["threads"]}t'
        panels[title][label].append((int(row["tokens"]), float(row["value"]),
                                     float(row["value_min"]), float(row["value_max"])))
    return panels


def peaks_of(rows):
    return {int(r["threads"]): float(r["value_max"]) for r in rows if r["stage"] == "peak" and r["impl"] == "fma"}


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"plot.py: matplotlib is missing ({error}); apt-get install python3-matplotlib", file=sys.stderr)
        return 1
    rows = load(sys.argv[1])
    panels, peaks = panels_of(rows), peaks_of(rows)
    if not panels:
        print("plot.py: no GFLOP/s rows to draw", file=sys.stderr)
        return 1
    columns = 3
    count = len(panels)
    figure, axes = plt.subplots((count + columns - 1) // columns, columns, figsize=(6 * columns, 4.2 * ((count + columns - 1) // columns)),
                                squeeze=False)
    # One colour per implementation, one line style per thread count, in every panel.
    impls = sorted({label.rsplit(" ", 1)[0] for lines in panels.values() for label in lines})
    colours = {impl: f"C{i}" for i, impl in enumerate(impls)}
    most_threads = max(peaks) if peaks else 0
    for axis, ((_, title), lines) in zip(axes.flat, sorted(panels.items())):
        for label, points in sorted(lines.items()):
            impl, threads = label.rsplit(" ", 1)
            points.sort()
            tokens = [p[0] for p in points]
            rates = [p[1] for p in points]
            errors = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
            style = "-" if threads == f"{most_threads}t" else "--"
            axis.errorbar(tokens, rates, yerr=errors, fmt=style + "o", color=colours[impl], capsize=3, markersize=4,
                          label=label)
        for threads, peak in sorted(peaks.items()):
            axis.axhline(peak, color="grey", linestyle=":", linewidth=1)
            axis.annotate(f"FMA peak {threads}t", (0.01, peak), xycoords=("axes fraction", "data"), fontsize=7,
                          color="grey", va="bottom")
        axis.set_xscale("log", base=2)
        axis.set_title(title)
        axis.set_xlabel("T (tokens)")
        axis.set_ylabel("GFLOP/s (flops the mask keeps)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[count:]:
        axis.set_visible(False)
    figure.suptitle("sneppx-bench: median GFLOP/s with min-max, against the measured FMA peak")
    figure.tight_layout()
    figure.savefig(sys.argv[2], dpi=110)
    print(f"chart written to {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
