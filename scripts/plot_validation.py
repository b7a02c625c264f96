#!/usr/bin/env python3
"""Predicted against measured throughput, one point per configuration, with the y = x line and
a ±10% band (the CSV of `ptdp validate --suite … --csv`).

usage: plot_validation.py VALIDATION.csv OUT.png [TITLE]
"""
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from plot_input import InputError, number, read_csv, run


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    lines = [(n, r) for n, r in read_csv(path, "ptdp validate CSV", ["name", "predicted_tokens_per_s", "measured_tokens_per_s"])
             if r.get("measured_tokens_per_s")]
    if not lines:
        raise InputError(f"{path}: no measured rows")
    rows = [r for _, r in lines]
    meas = [number(path, n, r, "measured_tokens_per_s", positive=True) for n, r in lines]
    pred = [number(path, n, r, "predicted_tokens_per_s", positive=True) for n, r in lines]
    lo, hi = min(meas + pred) / 1.3, max(meas + pred) * 1.3
    fig, ax = plt.subplots(figsize=(7, 6.3))
    xs = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="#55A868", alpha=0.15, label="±10%")
    ax.plot(xs, xs, color="#55A868", lw=1, label="predicted = measured")
    ax.scatter(meas, pred, color="#4C72B0", zorder=3)
    for r, x, y in zip(rows, meas, pred):
        ax.annotate(r["name"], (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ape = [abs(p - m) / m for p, m in zip(pred, meas)]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured throughput (tokens/s)")
    ax.set_ylabel("predicted throughput (tokens/s)")
    title = sys.argv[3] if len(sys.argv) > 3 else "ptdp validate"
    ax.set_title(f"{title}: throughput MAPE {100 * sum(ape) / len(ape):.1f}% over {len(rows)} configurations", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_validation.py")
