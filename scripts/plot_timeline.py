#!/usr/bin/env python3
"""Pipeline timeline from Chrome traces written by ptdp (`simulate --trace`, `train --trace`):
the predicted trace above the measured one, one row per pipeline rank, forward / backward /
communication coloured.

usage: plot_timeline.py OUT.png PREDICTED_TRACE.json [MEASURED_TRACE.json]
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from plot_input import InputError, read_json, run

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#E6A26B", "W": "#C44E52", "OPTIM": "#8172B3",
           "tp": "#55A868", "pp": "#937860", "dp": "#DA8BC3"}


def events_by_rank(path):
    """{pipeline rank: [(start_s, dur_s, colour key)]} for the first device of each pipeline rank."""
    trace = read_json(path, "Chrome trace")
    evs = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(evs, list):
        raise InputError(f"{path}: not a Chrome trace (expected a list of events or {{\"traceEvents\": [...]}})")
    first_device = {}
    rows = {}
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        bad = [k for k in ("pid", "ts", "dur") if not isinstance(e.get(k), (int, float)) or isinstance(e.get(k), bool)]
        if bad or not isinstance(e.get("args", {}), dict) or not isinstance(e.get("name", ""), str):
            raise InputError(f"{path}: event {i}: {(bad or ['args'])[0]} is missing or has the wrong type")
        args = e.get("args", {})
        rank = args.get("pipeline_rank", e["pid"])
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise InputError(f"{path}: event {i}: args.pipeline_rank must be an integer (got {rank!r})")
        dev = first_device.setdefault(rank, e["pid"])
        if e["pid"] != dev:
            continue
        cat = e.get("cat", "compute")
        action = args.get("action", e["name"])
        if cat == "compute":
            kind = "OPTIM" if action == "OPTIM" else "".join(ch for ch in action if ch.isalpha() or ch == "_")
            key = kind if kind in COLOURS else "F"
        else:
            if "RECV" in action:  # waiting in a receive is not work: leave it blank
                continue
            key = cat
        rows.setdefault(rank, []).append((e["ts"] / 1e6, e["dur"] / 1e6, key))
    return rows


def draw(ax, rows, title):
    end = 0
    for rank, evs in rows.items():
        for key in COLOURS:
            bars = [(s, d) for s, d, k in evs if k == key]
            if bars:
                ax.broken_barh(bars, (rank - 0.4, 0.8), facecolors=COLOURS[key], linewidth=0)
        end = max([end] + [s + d for s, d, _ in evs])
    ax.set_ylim(max(rows) + 0.6 if rows else 1, -0.6)
    ax.set_yticks(sorted(rows))
    ax.set_yticklabels([f"rank {r}" for r in sorted(rows)], fontsize=8)
    ax.set_xlim(0, end * 1.01 if end else 1)
    ax.set_title(f"{title} — iteration {end:.3g} s", fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    traces = [("predicted", sys.argv[2])] + ([("measured", sys.argv[3])] if len(sys.argv) > 3 else [])
    fig, axes = plt.subplots(len(traces), 1, figsize=(13, 1.2 + 2.2 * len(traces)), squeeze=False)
    for ax, (name, path) in zip(axes[:, 0], traces):
        rows = events_by_rank(path)
        if not rows:
            raise InputError(f"{path}: no complete events (ph \"X\") to draw")
        draw(ax, rows, f"{name}: {path}")
    axes[-1, 0].set_xlabel("time in the iteration (s)")
    labels = {"F": "forward", "B": "backward", "W": "weight grad", "OPTIM": "optimizer", "tp": "TP all-reduce",
              "pp": "pipeline send / all-gather", "dp": "DP all-reduce"}
    fig.legend(handles=[Patch(color=COLOURS[k], label=v) for k, v in labels.items()], loc="lower center", ncol=7,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(sys.argv[1], dpi=110)
    print(f"wrote {sys.argv[1]}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_timeline.py")
