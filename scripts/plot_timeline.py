#!/usr/bin/env python3
"""Pipeline timeline from Chrome traces written by ptdp (`simulate --trace`, `train --trace`, or a
PyTorch profiler trace that `ptdp plot timeline` converted to kernels by class):
the predicted trace above the measured one on one shared time axis, one row per pipeline rank,
forward / backward / communication coloured, microbatch numbers on the blocks wide enough.

usage: plot_timeline.py OUT.png PREDICTED_TRACE.json [MEASURED_TRACE.json] [--from X] [--to Y] [--measured-name TEXT]

--from / --to select a window: a microbatch number (`12`, or `12mb`: from the first action of
microbatch X, on any rank, to the first action of microbatch Y + 1, so the window holds the
steady-state work of microbatches X … Y) or a time from the start of the iteration (`1.5s`,
`300ms`, `20us`).
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from plot_input import InputError, read_json, run

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#E6A26B", "W": "#C44E52", "OPTIM": "#8172B3",
           "tp": "#55A868", "pp": "#937860", "dp": "#DA8BC3", "cp": "#8C8C8C", "ep": "#CCB974", "nccl": "#64B5CD"}
ACTION = re.compile(r"^(\d+)([A-Z_]+?)(\d+)$")
DPI = 110


def events_by_rank(path):
    """{pipeline rank: [(start_s, dur_s, colour key, microbatch or None)]} for the first device of
    each pipeline rank, times from the trace's first event."""
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
        if not isinstance(action, str):
            action = str(action)
        m = ACTION.match(action)
        mb = int(m.group(3)) if m else None
        if cat == "compute":
            kind = "OPTIM" if action == "OPTIM" else "".join(ch for ch in action if ch.isalpha() or ch == "_")
            key = kind if kind in COLOURS else "F"
        else:
            if "RECV" in action:  # waiting in a receive is not work: leave it blank
                continue
            key = cat
        rows.setdefault(rank, []).append((e["ts"] / 1e6, e["dur"] / 1e6, key, mb if cat == "compute" else None))
    if rows:
        t0 = min(s for evs in rows.values() for s, _, _, _ in evs)
        rows = {r: [(s - t0, d, k, mb) for s, d, k, mb in evs] for r, evs in rows.items()}
    return rows


def parse_bound(text, option):
    """('mb', n) or ('s', seconds)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*(mb)?\s*", text)
    if m:
        return ("mb", int(m.group(1)))
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|ns)\s*", text)
    if m:
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]
        return ("s", float(m.group(1)) * scale)
    raise InputError(f"{option}: expected a microbatch number (12, 12mb) or a time (1.5s, 300ms, 20us) (got '{text}')")


def iteration_title(path, end):
    """The iteration as `ptdp compare` reports it: a converted measured trace says which (the mean
    profiler step, else the kernel span), and the profiled window beside it when they differ; a
    ptdp trace is one iteration."""
    trace = read_json(path, "Chrome trace")
    it = trace.get("ptdp_iteration") if isinstance(trace, dict) else None
    if isinstance(it, dict) and isinstance(it.get("seconds"), (int, float)) and isinstance(it.get("from"), str):
        title = f"iteration {it['seconds']:.3g} s ({it['from']})"
        if abs(end - it["seconds"]) > 1e-3 * max(end, it["seconds"]):
            title += f"; profiled window {end:.3g} s"
        return title
    return f"iteration {end:.3g} s"


def window_of(rows, lo, hi, path):
    """The (start, end) in seconds of the window [lo, hi] in this trace."""
    end = max(s + d for evs in rows.values() for s, d, _, _ in evs)
    start_s, end_s = 0.0, end
    mbs = [mb for evs in rows.values() for _, _, _, mb in evs if mb is not None]
    if lo is not None:
        if lo[0] == "s":
            start_s = lo[1]
        else:
            if not mbs or lo[1] > max(mbs):
                raise InputError(f"--from {lo[1]}: {path} has microbatches 0 … {max(mbs) if mbs else 'none'}")
            start_s = min(s for evs in rows.values() for s, _, _, mb in evs if mb is not None and mb >= lo[1])
    if hi is not None:
        if hi[0] == "s":
            end_s = hi[1]
        else:
            if not mbs or hi[1] < min(mbs):
                raise InputError(f"--to {hi[1]}: {path} has no action of microbatches up to {hi[1]}")
            later = [s for evs in rows.values() for s, _, _, mb in evs if mb is not None and mb > hi[1]]
            end_s = min(later) if later else end
    if not end_s > start_s:
        raise InputError(f"--from/--to: the window is empty ({start_s:.6g} s … {end_s:.6g} s)")
    return start_s, end_s, end


def draw(ax, rows, title, x0, x1, width_in):
    px_per_s = width_in * DPI / (x1 - x0)
    for rank, evs in rows.items():
        shown = [(s, d, k, mb) for s, d, k, mb in evs if s + d >= x0 and s <= x1]
        for key in COLOURS:
            bars = [(s, d) for s, d, k, _ in shown if k == key]
            if bars:
                # Compute fills the row; communication (which may run inside a compute action, as
                # tensor-parallel all-reduces do) is a strip along the row's bottom edge. Thin white
                # edges keep neighbouring blocks apart when they are narrow.
                band = (rank - 0.4, 0.8) if key in ("F", "B", "I", "W", "OPTIM") else (rank + 0.18, 0.22)
                widths = sorted(d for _, d in bars)
                edge = 0.3 if widths[len(widths) // 2] * px_per_s >= 4 else 0
                ax.broken_barh(bars, band, facecolors=COLOURS[key], edgecolor="white", linewidth=edge)
        for s, d, k, mb in shown:
            if mb is not None and k in ("F", "B", "I", "W") and d * px_per_s >= 7 * len(str(mb)) + 4:
                mid = (max(s, x0) + min(s + d, x1)) / 2
                ax.text(mid, rank - 0.1, str(mb), ha="center", va="center", fontsize=6.5, color="white", clip_on=True)
    ax.set_ylim(max(rows) + 0.6 if rows else 1, -0.6)
    ax.set_yticks(sorted(rows))
    ax.set_yticklabels([f"rank {r}" for r in sorted(rows)], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def main():
    positional, options = [], {}
    argv = sys.argv[1:]
    i = 0
    while i < len(argv):
        if argv[i] in ("--from", "--to", "--measured-name"):
            if i + 1 >= len(argv):
                raise InputError(f"{argv[i]}: missing value")
            options[argv[i]] = argv[i + 1] if argv[i] == "--measured-name" else parse_bound(argv[i + 1], argv[i])
            i += 2
        else:
            positional.append(argv[i])
            i += 1
    if len(positional) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out = positional[0]
    traces = [("predicted", positional[1])] + ([("measured", positional[2])] if len(positional) > 2 else [])
    lo, hi = options.get("--from"), options.get("--to")
    loaded = []
    for name, path in traces:
        rows = events_by_rank(path)
        if not rows:
            raise InputError(f"{path}: no complete events (ph \"X\") to draw")
        loaded.append((name, path, rows, window_of(rows, lo, hi, path)))
    # One time axis for every panel: the union of the windows.
    x0 = min(w[0] for *_, w in loaded)
    x1 = max(w[1] for *_, w in loaded)
    ranks = max(len(rows) for _, _, rows, _ in loaded)
    width_in = 14.0
    fig, axes = plt.subplots(len(loaded), 1, figsize=(width_in, 1.0 + len(loaded) * (0.9 + 0.32 * ranks)), squeeze=False,
                             sharex=True)
    for ax, (name, path, rows, (_, _, end)) in zip(axes[:, 0], loaded):
        shown = options.get("--measured-name", path) if name == "measured" else path
        draw(ax, rows, f"{name}: {shown} — {iteration_title(path, end)}", x0, x1, width_in * 0.85)
    axes[-1, 0].set_xlim(x0, x1)
    what = "time in the iteration (s)"
    if lo is not None or hi is not None:
        def show(b, default):
            return default if b is None else (f"microbatch {b[1]}" if b[0] == "mb" else f"{b[1]:.6g} s")
        what += f"; window {show(lo, 'start')} … {show(hi, 'end')}"
    axes[-1, 0].set_xlabel(what)
    mbs = max((mb for _, _, rows, _ in loaded for evs in rows.values() for _, _, _, mb in evs if mb is not None), default=-1) + 1
    if mbs > 32 and lo is None and hi is None:
        print(f"plot_timeline.py: {mbs} microbatches in one picture: use --from/--to (e.g. --from 0 --to 15) for a readable window",
              file=sys.stderr)
    labels = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad", "OPTIM": "optimizer", "tp": "TP all-reduce",
              "pp": "pipeline send / all-gather", "dp": "DP all-reduce"}
    # Classes only measured GPU traces have (NCCL kernels by process group, or of an unknown group).
    drawn = {k for _, _, rows, _ in loaded for evs in rows.values() for _, _, k, _ in evs}
    labels.update({k: v for k, v in (("cp", "CP exchange"), ("ep", "expert all-to-all"), ("nccl", "NCCL, group unknown")) if k in drawn})
    fig.legend(handles=[Patch(color=COLOURS[k], label=v) for k, v in labels.items()], loc="lower center", ncol=len(labels),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 if ranks > 4 else 0.07, 1, 1))
    fig.savefig(out, dpi=DPI)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    run(main, "plot_timeline.py")
