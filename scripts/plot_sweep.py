#!/usr/bin/env python3
"""Sweep chart: for each (tensor, pipeline), one bar per micro-batch size with the best value of
the figure the sweep ranked by (CSV columns ranked_by / ranked_value: tokens/s, cost or energy per
token, as in the table; TFLOP/s per GPU for CSVs without them); (t, p, b) with no configuration
that fits in GPU memory are marked with an x, and the top three ranks are annotated.

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
    header = rows[0][1].keys() if rows else []
    ranked = "ranked_by" in header and "ranked_value" in header and any(r.get("ranked_by") for _, r in rows)
    metric = next((r["ranked_by"] for _, r in rows if r.get("ranked_by")), "tflops_per_gpu") if ranked else "tflops_per_gpu"
    labels = {"tokens_per_s": ("predicted tokens/s (the ranking figure)", True),
              "cost_usd": ("predicted cost, USD (the ranking figure; lower is better)", False),
              "gpu_hours_per_mtok": ("GPU-hours per million tokens (the ranking figure; lower is better)", False),
              "kwh_per_mtok": ("kWh per million tokens (the ranking figure; lower is better)", False),
              "tflops_per_gpu": ("best predicted TFLOP/s per GPU", True)}
    if metric not in labels:
        raise InputError(f"{path}: column ranked_by: unknown figure '{metric}'")
    ylabel, higher = labels[metric]
    better = max if higher else min
    best = {}   # (t, p, b) -> best figure
    winners = []  # (rank, (t, p, b), label)
    oom = set()
    for line, r in rows:
        key = tuple(number(path, line, r, c, integer=True, positive=True) for c in ("tensor", "pipeline", "micro_batch"))
        if r["status"] == "oom":
            oom.add(key)
            continue
        if r["status"] != "ok":
            continue
        if ranked:
            column = "ranked_value"
        else:
            column = "refined_tflops_per_gpu" if r.get("refined_tflops_per_gpu") else "tflops_per_gpu"
        if r.get(column):
            v = number(path, line, r, column)
            best[key] = better(best[key], v) if key in best else v
            if r.get("rank") and r["rank"].isdigit() and int(r["rank"]) <= 3:
                label = f"#{r['rank']} {r.get('schedule', '')}" + (f" rc-{r['recompute']}" if r.get("recompute") else "")
                winners.append((int(r["rank"]), key, v, label))
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
            ax.scatter(ox, [0.01 * max(best.values())] * len(ox), marker="x", color="crimson", s=18, zorder=3)
    # The winners, on their (t, p, b) bar.
    top = max(best.values()) if best else 1.0
    # Winners on one bar share one annotation (one line each, best rank first), so no leader
    # line crosses another winner's label.
    on_bar = {}
    for rank, key, v, label in sorted(winners):
        on_bar.setdefault(key, []).append((rank, v, label))
    for (t, p, b), ranked in sorted(on_bar.items(), key=lambda kv: kv[1][0][0]):
        if b not in bs:
            continue
        rank, v = ranked[0][0], max(w[1] for w in ranked)
        x = x_of[(t, p)] - 0.4 + (bs.index(b) + 0.5) * width
        ax.scatter([x], [v], marker="*", s=160 if rank == 1 else 90, color="gold", edgecolor="black", zorder=4)
        ax.annotate("\n".join(w[2] for w in ranked), (x, v), xytext=(0, 8 + 12 * (rank - 1)), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, fontweight="bold" if rank == 1 else "normal",
                    arrowprops=dict(arrowstyle="-", lw=0.5, color="gray") if rank > 1 else None)
    ax.set_ylim(0, top * 1.22)
    none_fit = [x_of[tp] for tp in tps if tp not in fits_tp]
    if none_fit:
        ax.scatter(none_fit, [0.01 * top] * len(none_fit), marker="X", color="crimson", s=70, zorder=3)
    ax.scatter([], [], marker="x", color="crimson", label="this b does not fit in memory")
    ax.scatter([], [], marker="X", color="crimson", s=70, label="no micro batch fits")
    ax.set_xticks(range(len(tps)))
    ax.set_xticklabels([f"t{t}\np{p}" for t, p in tps], fontsize=8)
    ax.set_xlabel("(tensor, pipeline) — data = GPUs / (t·p)")
    ax.set_ylabel(ylabel)
    ax.set_title(title + "\nbest schedule and recompute per (t, p, micro batch); ★ = ranks 1–3", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_sweep.py")
