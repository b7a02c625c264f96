#!/usr/bin/env python3
"""Predicted against measured iteration time (the load-robust one when the CSV has it: computation
in CPU seconds, composed with the fabric's communication), one point per configuration, with the y = x line and
a ±10% band, and the iteration-time MAPE that `ptdp validate --suite` prints (the CSV of
`ptdp validate --suite … --csv`; a CSV with only tokens/s columns is drawn as throughput). Labels
are placed where they overlap neither each other nor the points.

usage: plot_validation.py VALIDATION.csv OUT.png [TITLE]
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from plot_input import InputError, number, read_csv, run


def place_labels(ax, fig, names, xs, ys):
    """Each label at the first of a ring of offsets around its point where its box overlaps no
    placed label and no point; a thin leader line when it had to move away."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    pts = [ax.transData.transform((x, y)) for x, y in zip(xs, ys)]
    point_boxes = [(px - 4, py - 4, px + 4, py + 4) for px, py in pts]
    placed = []

    def overlaps(b, boxes):
        return any(not (b[2] < o[0] or b[0] > o[2] or b[3] < o[1] or b[1] > o[3]) for o in boxes)

    inside = ax.get_window_extent(renderer)
    order = sorted(range(len(names)), key=lambda i: (pts[i][1], pts[i][0]))
    for i in order:
        best = None
        for radius in (6, 14, 24, 36, 50, 66):
            for dx, dy in ((1, 0.3), (1, -1), (-1, 0.3), (-1, -1), (0, 1.2), (0, -1.8), (1, 1.2), (-1, 1.2), (1, -2), (-1, -2)):
                ox, oy = dx * radius, dy * radius
                ha = "left" if dx > 0 else "right" if dx < 0 else "center"
                t = ax.annotate(names[i], (xs[i], ys[i]), xytext=(ox, oy), textcoords="offset points", fontsize=7, ha=ha,
                                va="center")
                bb = t.get_window_extent(renderer)
                box = (bb.x0 - 1, bb.y0 - 1, bb.x1 + 1, bb.y1 + 1)
                fits = bb.x0 >= inside.x0 and bb.x1 <= inside.x1 and bb.y0 >= inside.y0 and bb.y1 <= inside.y1
                if fits and not overlaps(box, placed) and not overlaps(box, point_boxes):
                    best = (t, box, radius)
                    break
                t.remove()
            if best:
                break
        if best is None:  # nowhere free: the nearest spot
            t = ax.annotate(names[i], (xs[i], ys[i]), xytext=(6, 2), textcoords="offset points", fontsize=7)
            best = (t, None, 6)
        t, box, radius = best
        if box:
            placed.append(box)
        if radius > 14:
            t.arrow_patch = None
            t.set_annotation_clip(False)
            ax.annotate("", (xs[i], ys[i]), xytext=t.get_position(), textcoords="offset points",
                        arrowprops=dict(arrowstyle="-", lw=0.4, color="gray"))


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
    by_time = all(r.get("predicted_iteration_time_s") and r.get("measured_iteration_time_s") for r in rows)
    by_compute = all(r.get("predicted_compute_iteration_s") and r.get("measured_compute_iteration_s") for r in rows)
    if by_compute:  # the load-robust figure `ptdp validate --suite` reports (computation in CPU seconds)
        meas = [number(path, n, r, "measured_compute_iteration_s", positive=True) for n, r in lines]
        pred = [number(path, n, r, "predicted_compute_iteration_s", positive=True) for n, r in lines]
        what, unit = "iteration, computation in CPU time", "s"
    elif by_time:  # wall clock (CSVs of earlier versions)
        meas = [number(path, n, r, "measured_iteration_time_s", positive=True) for n, r in lines]
        pred = [number(path, n, r, "predicted_iteration_time_s", positive=True) for n, r in lines]
        what, unit = "iteration time", "s"
    else:
        meas = [number(path, n, r, "measured_tokens_per_s", positive=True) for n, r in lines]
        pred = [number(path, n, r, "predicted_tokens_per_s", positive=True) for n, r in lines]
        what, unit = "throughput", "tokens/s"
    lo, hi = min(meas + pred) / 1.3, max(meas + pred) * 1.3
    fig, ax = plt.subplots(figsize=(8, 7))
    xs = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="#55A868", alpha=0.15, label="±10%")
    ax.plot(xs, xs, color="#55A868", lw=1, label="predicted = measured")
    ax.scatter(meas, pred, color="#4C72B0", zorder=3, s=16)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {what} ({unit})")
    ax.set_ylabel(f"predicted {what} ({unit})")
    ape = [abs(p - m) / m for p, m in zip(pred, meas)]
    if by_compute and all(r.get("compute_iteration_error") for r in rows):
        ape = [abs(number(path, n, r, "compute_iteration_error")) for n, r in lines]
    elif by_time and all(r.get("iteration_time_error") for r in rows):  # the errors ptdp validate averaged
        ape = [abs(number(path, n, r, "iteration_time_error")) for n, r in lines]
    title = sys.argv[3] if len(sys.argv) > 3 else "ptdp validate"
    ax.set_title(f"{title}: {what} MAPE {100 * sum(ape) / len(ape):.1f}% over {len(rows)} configurations", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    names = [f"{r['name']} ({100 * (p - m) / m:+.0f}%)" for r, p, m in zip(rows, pred, meas)]
    place_labels(ax, fig, names, meas, pred)
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_validation.py")
