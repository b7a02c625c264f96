#!/usr/bin/env python3
"""Fit the GPU presets' flash-attention and FP8-GEMM parameters to the kernel tables of
../shared/reference/modern-training-facts.md (§2, §3), and print every table row beside the model.

The model is model/cost.cpp's (attention_efficiency, shape_efficiency), written again here in
numpy for the fit; tests/model/kernels_test.cpp checks the C++ side against the same rows.
Needs python3-numpy and python3-scipy (Debian). Usage: scripts/fit_kernels.py
"""
import numpy as np
from scipy.optimize import least_squares

S = np.array([512, 1024, 2048, 4096, 8192, 16384], dtype=float)
BLOCK = 128.0


def attn_eff(s, dh, causal, emax, s_half, c):
    walk = s / 2 if causal else s
    e = emax * walk / (walk + s_half)
    if causal:
        e = e * s / (s + BLOCK)
    return e * (dh / (dh + c)) / (128.0 / (128.0 + c))


def fit_attention_forward_backward(name, peak, fwd_rows, bwd_rows):
    """fwd_rows, bwd_rows: (dh, causal, [TFLOP/s by S]); fits emax_f, s_f, emax_b, s_b, c."""
    return fit_attention_all(name, peak, fwd_rows, bwd_rows, [], start=[0.6, 200, 0.55, 400, 40])


def fit_attention_combined(name, peak, emax_f, emax_b, rows):
    """FA2 on A100: forward+backward TFLOP/s only; the ceilings come from the paper's separate
    peaks, the fit gives one seq_half for both passes and the head-dim constant."""
    def combined(s, dh, causal, sh, c):
        tf = attn_eff(s, dh, causal, emax_f, sh, c) * peak
        tb = attn_eff(s, dh, causal, emax_b, sh, c) * peak
        return 3.5 / (1 / tf + 2.5 / tb)

    def resid(x):
        sh, c = x
        r = []
        for dh, causal, vals in rows:
            r += list(np.log(combined(S, dh, causal, sh, c) / np.array(vals)))
        return r
    sh, c = least_squares(resid, [200, 30], bounds=([0, 0], [1e5, 1e4])).x
    print(f"\n{name}: fwd_max {emax_f:.4f} bwd_max {emax_b:.4f} seq_half {sh:.1f} (both) head_dim_half {c:.2f}")
    for dh, causal, vals in rows:
        pred = combined(S, dh, causal, sh, c)
        errs = " ".join(f"{100 * (p / v - 1):+5.1f}%" for p, v in zip(pred, vals))
        print(f"  fwd+bwd d_h {dh:3d} {'causal    ' if causal else 'non-causal'}  measured {vals}  model {np.round(pred).astype(int).tolist()}  {errs}")
    return sh, c


def report(name, peak, x, fwd_rows, bwd_rows, _):
    ef, sf, eb, sb, c = x
    print(f"\n{name}: fwd_max {ef:.4f} fwd_seq_half {sf:.1f} bwd_max {eb:.4f} bwd_seq_half {sb:.1f} head_dim_half {c:.2f}")
    for label, rows, e, sh in (("fwd", fwd_rows, ef, sf), ("bwd", bwd_rows, eb, sb)):
        for dh, causal, vals in rows:
            pred = attn_eff(S, dh, causal, e, sh, c) * peak
            errs = " ".join(f"{100 * (p / v - 1):+5.1f}%" for p, v in zip(pred, vals))
            print(f"  {label} d_h {dh:3d} {'causal    ' if causal else 'non-causal'}  measured {vals}  model {np.round(pred).astype(int).tolist()}  {errs}")


def fit_attention_all(name, peak, fwd_rows, bwd_rows, combined_rows, start=(0.4, 200, 0.35, 400, 40)):
    """Forward, backward and forward+backward tables of one kernel together (FlashAttention-2 on
    H100: the FA3 paper's forward and backward bars and the FA2 paper's fwd+bwd figure); fits
    emax_f, s_f, emax_b, s_b and the head-dim constant."""
    def combined(s, dh, causal, x):
        ef, sf, eb, sb, c = x
        tf = attn_eff(s, dh, causal, ef, sf, c) * peak
        tb = attn_eff(s, dh, causal, eb, sb, c) * peak
        return 3.5 / (1 / tf + 2.5 / tb)

    def resid(x):
        ef, sf, eb, sb, c = x
        r = []
        for dh, causal, vals in fwd_rows:
            r += list(np.log(attn_eff(S, dh, causal, ef, sf, c) * peak / np.array(vals)))
        for dh, causal, vals in bwd_rows:
            r += list(np.log(attn_eff(S, dh, causal, eb, sb, c) * peak / np.array(vals)))
        for dh, causal, vals in combined_rows:
            r += list(np.log(combined(S, dh, causal, x) / np.array(vals)))
        return r
    x = least_squares(resid, list(start), bounds=([0.05, 0, 0.05, 0, 0], [1, 1e5, 1, 1e5, 1e4])).x
    report(name, peak, x, fwd_rows, bwd_rows, None)
    for dh, causal, vals in combined_rows:
        pred = combined(S, dh, causal, x)
        errs = " ".join(f"{100 * (p / v - 1):+5.1f}%" for p, v in zip(pred, vals))
        print(f"  fwd+bwd d_h {dh:3d} {'causal    ' if causal else 'non-causal'}  measured {vals}  model {np.round(pred).astype(int).tolist()}  {errs}")
    return x


def gemm_shape(m, n, k, emax, half_dim, half_k=35.30, q=8.0):
    thin = min(m, n, k) ** q
    return emax * thin / (thin + half_k ** q) * (m * n * k) / (m * n * k + half_dim ** 3)


def fit_gemm(name, peak, emax, rows):
    """rows: ((m, n, k), TFLOP/s); the ceiling is given, the fit gives half_dim."""
    def resid(x):
        return [np.log(gemm_shape(m, n, k, emax, x[0]) * peak / v) for (m, n, k), v in rows]
    hd = least_squares(resid, [1000], bounds=([0], [1e5])).x[0]
    print(f"\n{name}: max {emax:.4f} half_dim {hd:.1f}")
    for (m, n, k), v in rows:
        p = gemm_shape(m, n, k, emax, hd) * peak
        print(f"  {m}x{n}x{k}: measured {v}  model {p:.0f}  {100 * (p / v - 1):+5.1f}%")
    return hd


def fit_cudnn_attention(name, peak, head_dim_half, fwd_rows, bwd_rows):
    """cuDNN's fused attention: the flash model with its own ceilings and walk lengths, the
    head-dim constant of the flash fit, and a factor on causal kernels (cuDNN loses more to the
    causal mask than FlashAttention-3). Fits emax_f, s_f, emax_b, s_b, causal_factor."""
    def model(s, dh, causal, e, sh, cf):
        return attn_eff(s, dh, causal, e, sh, head_dim_half) * (cf if causal else 1.0) * peak

    def resid(x):
        ef, sf, eb, sb, cf = x
        r = []
        for dh, causal, vals in fwd_rows:
            r += list(np.log(model(S, dh, causal, ef, sf, cf) / np.array(vals)))
        for dh, causal, vals in bwd_rows:
            r += list(np.log(model(S, dh, causal, eb, sb, cf) / np.array(vals)))
        return r
    ef, sf, eb, sb, cf = least_squares(resid, [0.6, 200, 0.55, 400, 0.9],
                                       bounds=([0.05, 0, 0.05, 0, 0.3], [1, 1e5, 1, 1e5, 1])).x
    print(f"\n{name}: fwd_max {ef:.4f} fwd_seq_half {sf:.1f} bwd_max {eb:.4f} bwd_seq_half {sb:.1f} causal_factor {cf:.4f}")
    for label, rows, e, sh in (("fwd", fwd_rows, ef, sf), ("bwd", bwd_rows, eb, sb)):
        for dh, causal, vals in rows:
            pred = model(S, dh, causal, e, sh, cf)
            errs = " ".join(f"{100 * (p / v - 1):+5.1f}%" for p, v in zip(pred, vals))
            print(f"  {label} d_h {dh:3d} {'causal    ' if causal else 'non-causal'}  measured {vals}  model {np.round(pred).astype(int).tolist()}  {errs}")


if __name__ == "__main__":
    # §3, FlashAttention-3 on H100: the presets' flash curve.
    fit_attention_forward_backward(
        "H100 FlashAttention-3", 989,
        [(128, False, [467, 565, 625, 638, 646, 648]), (128, True, [292, 423, 521, 579, 602, 616]),
         (64, False, [333, 392, 460, 476, 496, 497])],
        [(128, False, [316, 424, 501, 542, 559, 561])])
    # §3, H100 cuDNN fused attention (Transformer Engine's and Megatron's default backend): the
    # presets' cudnn_attention_* (head-dim constant from the FlashAttention-3 fit: cuDNN's table
    # has d_h 128 only).
    fit_cudnn_attention(
        "H100 cuDNN attention", 989, 67.61,
        [(128, False, [497, 574, 617, 609, 600, 595]), (128, True, [315, 410, 484, 518, 529, 539])],
        [(128, False, [305, 408, 465, 499, 518, 516])])
    # §3 / kernel-and-framework-facts §7, FlashAttention-2 on H100 (no Hopper features): the
    # kernel PyTorch's scaled_dot_product_attention runs (its flash backend) and flash-attn 2:
    # the presets' fa2_attention_* (training.attention_kernel flash2, the PyTorch frameworks').
    fit_attention_all(
        "H100 FlashAttention-2", 989,
        [(64, False, [282, 306, 318, 321, 322, 324]), (64, True, [180, 229, 262, 284, 295, 299]),
         (128, False, [309, 350, 362, 366, 370, 370]), (128, True, [191, 260, 298, 319, 333, 335])],
        [(128, False, [214, 260, 291, 310, 318, 322])],
        [(64, False, [215, 254, 274, 288, 294, 296]), (128, False, [248, 294, 320, 326, 335, 338]),
         (64, True, [141, 192, 232, 257, 273, 284]), (128, True, [163, 221, 265, 294, 308, 328])])
    # §3, FlashAttention-2 on A100: forward+backward, peaks fwd 225 and bwd 196 TFLOP/s.
    fit_attention_combined(
        "A100 FlashAttention-2", 312, 225 / 312, 196 / 312,
        [(64, False, [132, 162, 171, 175, 176, 176]), (128, False, [131, 181, 196, 201, 203, 203]),
         (64, True, [88, 119, 140, 158, 165, 171]), (128, True, [99, 131, 155, 182, 189, 189])])
    # §2, FP8 GEMMs (cuBLASLt): the ceiling is the MAMF fraction scaled like the A100 bf16 fit's
    # (0.7587 of peak end to end against MAMF 0.869: 0.873), the shape from the square sizes.
    scale = 0.7587 / 0.869
    sq = [1024, 2048, 4096, 8192, 16384]
    fit_gemm("H100 fp8 GEMM", 1979, 0.709 * scale,
             [((n, n, n), v) for n, v in zip(sq, [274.1, 1011.3, 1216.9, 1290.1, 1377.3])] +
             [((6144, 12288, 12288), 1351.4)])
    fit_gemm("GB200 fp8 GEMM", 5000, 0.723 * scale,
             [((n, n, n), v) for n, v in zip(sq, [489.2, 2243.6, 2834.6, 2876.6, 2906.9])] +
             [((6144, 12288, 12288), 2895.6)])
    fit_gemm("A100 fp16 GEMM (check of the shape model)", 312, 0.869 * scale,
             [((n, n, n), v) for n, v in zip(sq, [119.4, 221.8, 228.0, 253.7, 256.5])] +
             [((6144, 12288, 12288), 250.8)])
