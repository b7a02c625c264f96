#!/usr/bin/env python3
"""Sweep chart: best predicted TFLOP/s per GPU for each (tensor, pipeline), one series per
micro-batch size; (t, p, b) with no configuration that fits in GPU memory are marked with an x.

usage: plot_sweep.py SWEEP.csv OUT.png [TITLE]   (the CSV of `ptdp sweep --csv`)
"""
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
    rows = read_csv(path, "ptdp sweep CSV", ["tensor", "pipeline", "micro_batch", "status", "tflops_per_gpu"])
    title = sys.argv[3] if len(sys.argv) > 3 else "ptdp sweep"
    best = {}   # (t, p, b) -> best TFLOP/s
    oom = set()
    for line, r in rows:
        key = tuple(number(path, line, r, c, integer=True, positive=True) for c in ("tensor", "pipeline", "micro_batch"))
        if r["status"] == "oom":
            oom.add(key)
            continue
        if r["status"] != "ok":
            continue
        column = "refined_tflops_per_gpu" if r.get("refined_tflops_per_gpu") else "tflops_per_gpu"
        if r.get(column):
            best[key] = max(best.get(key, 0.0), number(path, line, r, column))
    oom -= set(best)
    tps = sorted({(t, p) for t, p, _ in list(best) + list(oom)})
    # Series: the micro-batch sizes for which something fits (at most 8, the smallest).
    bs = sorted({b for _, _, b in best})[:8]
    best = {k: v for k, v in best.items() if k[2] in bs}
    fits_tp = {(t, p) for t, p, _ in best}
    if not tps:
        raise InputError(f"{path}: no configurations (no row with status ok or oom)")
    x_of = {tp: i for i, tp in enumerate(tps)}
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(tps) + 3), 5.5))
    width = 0.8 / max(1, len(bs))
    cmap = plt.get_cmap("plasma")
    for j, b in enumerate(bs):
        color = cmap(0.85 * j / max(1, len(bs) - 1))
        xs = [x_of[(t, p)] - 0.4 + (j + 0.5) * width for (t, p, bb) in best if bb == b]
        ys = [v for (t, p, bb), v in best.items() if bb == b]
        ax.bar(xs, ys, width=width, color=color, label=f"b = {b}")
        ox = [x_of[(t, p)] - 0.4 + (j + 0.5) * width for (t, p, bb) in oom if bb == b and (t, p) in fits_tp]
        if ox:
            ax.scatter(ox, [3] * len(ox), marker="x", color="crimson", s=18, zorder=3)
    none_fit = [x_of[tp] for tp in tps if tp not in fits_tp]
    if none_fit:
        ax.scatter(none_fit, [3] * len(none_fit), marker="X", color="crimson", s=70, zorder=3)
    ax.scatter([], [], marker="x", color="crimson", label="this b does not fit in memory")
    ax.scatter([], [], marker="X", color="crimson", s=70, label="no micro batch fits")
    ax.set_xticks(range(len(tps)))
    ax.set_xticklabels([f"t{t}\np{p}" for t, p in tps], fontsize=8)
    ax.set_xlabel("(tensor, pipeline) — data = GPUs / (t·p)")
    ax.set_ylabel("best predicted TFLOP/s per GPU")
    ax.set_title(title + ": best schedule and recompute per (t, p, micro batch)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_sweep.py")
