#!/usr/bin/env python3
"""Fit the dgx-a100 efficiency parameters to the calibration data of ptdp-facts.md.

Targets: paper Table 1 rows without pipeline parallelism (scenarios/paper/gpt-*.yaml) and the
single-GPU microbatch curve of a 1B model (paper figure 7; one microbatch per iteration).
Minimises the sum of squared relative errors of TFLOP/s per GPU with Nelder-Mead over
  gemm_max_efficiency, gemm_half_dim, gemm_half_k, elementwise_efficiency, iteration_overhead
by running `ptdp simulate --fidelity analytic --json` with --set overrides. Prints the fit and
its residuals (a Markdown table for docs/ACCURACY.md).

usage: scripts/fit_calibration.py [--ptdp build/ptdp] [--iterations 300] [--check]
  --check: only evaluate the parameters in topologies/dgx-a100.yaml and print residuals.
"""
import argparse, json, os, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE1 = [("gpt-1.7b", 137.0), ("gpt-3.6b", 138.0), ("gpt-7.5b", 142.0), ("gpt-18.4b", 135.0)]
CURVE = [(1, 68.0), (2, 78.0), (4, 86.0), (8, 89.0), (16, 91.0)]
PARAMS = ["gemm_max_efficiency", "gemm_half_dim", "gemm_half_k", "gemm_thin_exponent", "elementwise_efficiency",
          "iteration_overhead"]


def targets():
    out = []
    for name, tf in TABLE1:
        out.append((f"Table 1 {name[4:]}", f"scenarios/paper/{name}.yaml", [], tf))
    for b, tf in CURVE:
        out.append((f"1B, 1 GPU, b={b}", "scenarios/paper/gpt-1b-single-gpu.yaml",
                    [f"training.micro_batch={b}", f"training.global_batch={b}"], tf))
    return out


def overrides(x):
    if x is None:
        return []
    e, hd, hk, q, ew, ov = x
    return [f"cluster.topology.gpu.gemm_max_efficiency={e}", f"cluster.topology.gpu.gemm_half_dim={hd}",
            f"cluster.topology.gpu.gemm_half_k={hk}", f"cluster.topology.gpu.gemm_thin_exponent={q}",
            f"cluster.topology.gpu.elementwise_efficiency={ew}",
            f"cluster.topology.gpu.iteration_overhead={ov}s"]


def predict(ptdp, x, fidelity="analytic"):
    def one(t):
        label, scen, sets, target = t
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [ptdp, "simulate", os.path.join(ROOT, scen), "--fidelity", fidelity, "--json", f.name]
            for s in sets + overrides(x):
                cmd += ["--set", s]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
            return json.load(open(f.name))["tflops_per_gpu"]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(one, targets()))


def loss(ptdp, x):
    e, hd, hk, q, ew, ov = x
    if not (0.05 < e <= 1 and hd >= 0 and hk >= 0 and 0.2 <= q <= 8 and 0.05 < ew <= 1 and ov >= 0):
        return 1e9
    preds = predict(ptdp, x)
    return sum(((p - t[3]) / t[3]) ** 2 for p, t in zip(preds, targets()))


def nelder_mead(f, x0, steps, iterations):
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (steps[j] if j == i else 0) for j in range(n)] for i in range(n)]
    vals = [f(p) for p in pts]
    for it in range(iterations):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if it % 20 == 0:
            print(f"  iteration {it}: loss {vals[0]:.6f}", file=sys.stderr)
        c = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        xr = [c[j] + (c[j] - pts[-1][j]) for j in range(n)]
        fr = f(xr)
        if fr < vals[0]:
            xe = [c[j] + 2 * (c[j] - pts[-1][j]) for j in range(n)]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [c[j] + 0.5 * (pts[-1][j] - c[j]) for j in range(n)]
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    best = min(range(n + 1), key=lambda i: vals[i])
    return pts[best], vals[best]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptdp", default=os.path.join(ROOT, "build", "ptdp"))
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--fidelity", default="analytic")
    a = ap.parse_args()
    if a.check:
        x = None
    else:
        x0 = [0.85, 128.0, 64.0, 2.0, 0.8, 0.03]
        x, v = nelder_mead(lambda p: loss(a.ptdp, p), x0, [0.05, 64, 32, 0.5, 0.1, 0.02], a.iterations)
        print("fit:", ", ".join(f"{k} {v:.4g}" for k, v in zip(PARAMS, x)))
    preds = predict(a.ptdp, x, a.fidelity)
    print(f"\n| configuration | measured TFLOP/s | predicted ({a.fidelity}) | error |")
    print("|---|---|---|---|")
    worst = 0
    for p, t in zip(preds, targets()):
        err = (p - t[3]) / t[3]
        worst = max(worst, abs(err))
        print(f"| {t[0]} | {t[3]:.0f} | {p:.1f} | {100 * err:+.1f}% |")
    print(f"\nlargest error: {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
