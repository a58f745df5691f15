#!/usr/bin/env python3
"""Checks the FP8 (e4m3) weight kernels against a float64 NumPy reference
(and, with `--only q8_0`, the GEMVs and expansion of native GGUF Q8_0
weights the same way, in quant.cu's layout):
`quantize_rows_e4m3` (fp8.cu) and every `gemv_fp8_*` variant (gemv.cu) on
random inputs, with the matrix in the loader's layout (e4m3 rows, then one
f32 scale per row at the next 256-byte boundary). The reference multiplies
the bf16 activations by the dequantized weights (e4m3 value x row scale),
so the tolerances are those of the bf16 GEMV checks: what is measured is
the kernel's arithmetic, not FP8's rounding (compare_fp8.py measures that
on whole models). The fused producers of FP8 GEMM inputs (`rms_norm_e4m3`,
`silu_mul_e4m3`, `gelu_tanh_mul_e4m3`) must give the same bytes and scales
as the two kernels they replace (elementwise.cu's norm or activation, then
`quantize_rows_e4m3`).

    python3 tests/gpu/check_fp8.py --cubins DIR

Prints one line per check and exits 1 if any fails.
"""
import argparse
import ctypes
import math
import os
import sys

import numpy as np
import torch

import check_kernels as ck
from check_kernels import bf, dev, f32, host, i32, launch, ptr, rel, report, rnd

E4M3_MAX = 448.0


def fp8_matrix(rng, rows, cols, scale=0.05):
    """(device buffer in the loader's layout, dequantized float64 weights)."""
    w = rnd(rng, rows, cols, scale=scale) * rng.uniform(0.2, 5.0, size=(rows, 1))
    s = (np.abs(w).max(1) / E4M3_MAX).astype(np.float32)
    q = torch.tensor(w / s.astype(np.float64)[:, None]).to(torch.float8_e4m3fn)
    deq = q.double().numpy() * s.astype(np.float64)[:, None]
    at = (rows * cols + 255) // 256 * 256
    buf = torch.zeros(at + rows * 4, dtype=torch.uint8)
    buf[: rows * cols] = q.view(torch.uint8).flatten()
    buf[at:] = torch.from_numpy(s.copy()).view(torch.uint8)
    return buf.cuda(), deq


def q8_0_matrix(rng, rows, cols, scale=0.05):
    """(device buffer in the native GGUF layout of quant.cu: int8 quants
    row-major, then one f16 scale per block of 32 at the next 256-byte
    boundary; dequantized float64 weights). Blocks are quantized as
    llama.cpp's quantize_row_q8_0 does: d = absmax / 127, q = round(x / d)."""
    w = rnd(rng, rows, cols, scale=scale) * rng.uniform(0.2, 5.0, size=(rows, 1))
    blocks = w.reshape(rows, cols // 32, 32)
    d = (np.abs(blocks).max(-1) / 127.0).astype(np.float16)
    inv = np.where(d == 0, 0.0, 1.0 / d.astype(np.float64))
    q = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8)
    deq = (q.astype(np.float64) * d.astype(np.float64)[..., None]).reshape(rows, cols)
    at = (rows * cols + 255) // 256 * 256
    buf = torch.zeros(at + rows * cols // 32 * 2, dtype=torch.uint8)
    buf[: rows * cols] = torch.from_numpy(q.reshape(-1).view(np.uint8).copy())
    buf[at:] = torch.from_numpy(d.reshape(-1).view(np.uint8).copy())
    return buf.cuda(), deq


KINDS = {"fp8": ("gemv_fp8", fp8_matrix), "q8_0": ("gemv_q8_0", q8_0_matrix)}


def check_quantize(m, rng):
    """Row absmax / 448 scales and e4m3 bytes vs torch's own rounding."""
    for rows, cols in ((7, 576), (64, 4096), (3, 14336)):
        x = bf(rnd(rng, rows, cols, scale=2.0) * rng.uniform(0.01, 50.0, size=(rows, 1)))
        q = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
        s = torch.empty(rows, dtype=torch.float32, device="cuda")
        launch(m.fn("quantize_rows_e4m3"), (rows,), 256, [ptr(dev(x, torch.bfloat16)), ptr(q), ptr(s), i32(cols)])
        want_s = np.abs(x).max(1) / E4M3_MAX
        report(f"quantize_rows_e4m3 {rows}x{cols} scales", rel(host(s), want_s), 1e-6)
        got = q.cpu().view(torch.float8_e4m3fn).double().numpy()
        ref = torch.tensor(x / host(s)[:, None]).to(torch.float8_e4m3fn)
        same = float((q.cpu() == ref.view(torch.uint8)).double().mean())
        # Fast-math division may land a value one step away at a tie.
        report(f"quantize_rows_e4m3 {rows}x{cols} bytes equal to torch's", 1 - same, 1e-3)
        err = np.max(np.abs(got * host(s)[:, None] - x) / np.abs(x).max(1, keepdims=True))
        report(f"quantize_rows_e4m3 {rows}x{cols} dequantized error / row absmax", err, 1 / 16)


def check_scale_out(m, rng):
    """fp8_scale_out: y (=, +=) acc[t, o] * sx[t] * sw[o]."""
    t, o = 5, 300
    acc = rnd(rng, t, o, scale=100.0).astype(np.float32).astype(np.float64)
    sx = rng.uniform(0.001, 0.1, t).astype(np.float32).astype(np.float64)
    sw = rng.uniform(0.0001, 0.01, o).astype(np.float32).astype(np.float64)
    want = acc * sx[:, None] * sw[None, :]
    base = rnd(rng, t, o).astype(np.float32).astype(np.float64)
    for mode, dtype, start, tol in ((0, torch.bfloat16, None, 8e-3), (1, torch.float32, None, 1e-6),
                                    (2, torch.float32, base, 1e-6)):
        y = dev(start, dtype) if start is not None else torch.empty(t, o, dtype=dtype, device="cuda")
        launch(m.fn("fp8_scale_out"), (math.ceil(t * o / 256),), 256,
               [ptr(dev(acc, torch.float32)), ptr(dev(sx, torch.float32)), ptr(dev(sw, torch.float32)), ptr(y),
                i32(t), i32(o), i32(mode)])
        report(f"fp8_scale_out mode {mode}", rel(host(y), want + (0 if start is None else start)), tol)


def check_gemv_fp8(m, rng, kind="fp8", sizes=((1, 576, 960), (3, 1536, 576), (8, 4096, 1000), (2, 14336, 512))):
    prefix, matrix = KINDS[kind]
    for n, inp, out in sizes:
        x = bf(rnd(rng, n, inp))
        wd, w = matrix(rng, out, inp)
        want = x @ w.T
        xd = dev(x, torch.bfloat16)
        grid = (math.ceil(out / 8),)
        plain = (math.ceil(out / 8 / plain_rows(prefix, n)),)  # bf16, f32, add_f32
        # The k-quant GEMVs at batch 1 take int16 activations (a scale a run of 16: rounding of
        # 2^-16 of the run's largest value, gemv.cuh block_quantize_x); exact f32 elsewhere.
        tol32 = 1e-4 if prefix == "gemv_kq" and n == 1 else 1e-5
        tag = f"{prefix} n={n} {inp}->{out}"
        y = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{prefix}_n{n}_bf16"), plain, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(None), ptr(None), ptr(None)])
        report(f"{tag} bf16 out", rel(host(y), want), 8e-3)
        y = torch.empty(n, out, dtype=torch.float32, device="cuda")
        launch(m.fn(f"{prefix}_n{n}_f32"), plain, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(None), ptr(None), ptr(None)])
        report(f"{tag} f32 out", rel(host(y), want), tol32)
        base = rnd(rng, n, out).astype(np.float32).astype(np.float64)
        y = dev(base, torch.float32)
        ssb = ck.sumsq_buffer()
        g = (1 + 0.2 * rnd(rng, out)).astype(np.float32).astype(np.float64)
        xg = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{prefix}_n{n}_add_f32"), plain, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(ssb),
                                                         ptr(dev(g, torch.float32)), ptr(xg)])
        report(f"{tag} f32 accumulate", rel(host(y), base + want), tol32)
        got, _ = ck.sumsq_rows(ssb, n)
        report(f"{tag} f32 accumulate: sums of squares", rel(got, ((base + want) ** 2).sum(-1)), 1e-5)
        w2d, w2 = matrix(rng, 2 * out, inp)
        gate, up = x @ w2[:out].T, x @ w2[out:].T
        y = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{prefix}_n{n}_swiglu"), grid, 256, [ptr(xd), ptr(w2d), ptr(y), i32(inp), i32(out)])
        report(f"{tag} swiglu (bf16 out)", rel(host(y), gate / (1 + np.exp(-gate)) * up), 8e-3)
        launch(m.fn(f"{prefix}_n{n}_geglu"), grid, 256, [ptr(xd), ptr(w2d), ptr(y), i32(inp), i32(out)])
        report(f"{tag} geglu (bf16 out)", rel(host(y), ck.gelu_tanh(gate) * up), 8e-3)


def qkv_case(rng, n, H, KVH, hd, d, matrix=fp8_matrix):
    w = (H + 2 * KVH) * hd
    wqd, wq = matrix(rng, w, d)
    pos, slots = rng.integers(0, 512, n), rng.permutation(64)[:n]
    cos, sin = (a.astype(np.float32).astype(np.float64) for a in ck.rope_tables(hd, 512, 10000.0))
    q_out = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
    kc = torch.zeros(64, KVH * hd, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros(64, KVH * hd, dtype=torch.bfloat16, device="cuda")
    tail = [ptr(dev(pos, torch.int32)), ptr(dev(slots, torch.int64)), ptr(dev(cos, torch.float32)),
            ptr(dev(sin, torch.float32)), ptr(q_out), ptr(kc), ptr(vc), i32(H), i32(KVH), i32(hd), i32(16)]

    def verify(tag, y):
        q, k, v = (y[:, a:b].reshape(n, -1, hd) for a, b in
                   ((0, H * hd), (H * hd, (H + KVH) * hd), ((H + KVH) * hd, w)))
        kh = ck.from_device_layout(host(kc), KVH, hd, 16)[slots].reshape(n, KVH, hd)
        vh = ck.from_device_layout(host(vc), KVH, hd, 16)[slots].reshape(n, KVH, hd)
        report(f"{tag} q", rel(host(q_out).reshape(n, H, hd), ck.rotate(q, cos, sin, pos)), 8e-3)
        report(f"{tag} k -> cache", rel(kh, ck.rotate(k, cos, sin, pos)), 8e-3)
        report(f"{tag} v -> cache", rel(vh, v), 8e-3)

    return w, wqd, wq, tail, verify


def check_qkv_rope_fp8(m, rng, kind="fp8", cases=((1, 9, 3, 64, 576), (4, 32, 8, 128, 4096))):
    prefix, matrix = KINDS[kind]
    for n, H, KVH, hd, d in cases:
        w, wqd, wq, tail, verify = qkv_case(rng, n, H, KVH, hd, d, matrix)
        x = bf(rnd(rng, n, d))
        launch(m.fn(f"{prefix}_n{n}_qkv_rope"), (math.ceil(w / 8),), 256,
               [ptr(dev(x, torch.bfloat16)), ptr(wqd), i32(d), ptr(None)] + tail)
        verify(f"{prefix} qkv_rope n={n} H={H} KVH={KVH} hd={hd}", x @ wq.T)


def plain_rows(prefix, n):
    """Output rows a warp of the plain GEMV modes computes (gemv.cuh:
    plain_rows): two for the k-quant types at batch 1; the host's grid."""
    return 2 if prefix == "gemv_kq" and n == 1 else 1


def check_fused_norm_fp8(m, rng, kind="fp8", d=576, ff=1536, n=2):
    """The normed variants: pre-scaled xg = bf16(x * g), 1/rms from SumSq."""
    prefix, matrix = KINDS[kind]
    eps = 1e-5
    x = rnd(rng, n, d, scale=3.0).astype(np.float32).astype(np.float64)
    nw = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    xg = bf(x * nw)
    xn = xg / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    ssb = ck.sumsq_buffer((x ** 2).sum(-1))
    xgd = dev(xg, torch.bfloat16)
    w2d, w2 = matrix(rng, 2 * ff, d)
    gate, up = xn @ w2[:ff].T, xn @ w2[ff:].T
    y = torch.empty(n, ff, dtype=torch.bfloat16, device="cuda")
    head = [ptr(xgd), f32(eps), ptr(ssb)]
    launch(m.fn(f"{prefix}_n{n}_swiglu_norm"), (math.ceil(ff / 8),), 256, head + [ptr(w2d), ptr(y), i32(d), i32(ff)])
    report(f"{prefix} n={n} swiglu with fused RMSNorm", rel(host(y), gate / (1 + np.exp(-gate)) * up), 8e-3)
    launch(m.fn(f"{prefix}_n{n}_geglu_norm"), (math.ceil(ff / 8),), 256, head + [ptr(w2d), ptr(y), i32(d), i32(ff)])
    report(f"{prefix} n={n} geglu with fused RMSNorm", rel(host(y), ck.gelu_tanh(gate) * up), 8e-3)
    wpd, wp = matrix(rng, 704, d)
    yp = torch.empty(n, 704, dtype=torch.bfloat16, device="cuda")
    launch(m.fn(f"{prefix}_n{n}_bf16_norm"), (704 // 8 // plain_rows(prefix, n),), 256, head + [ptr(wpd), ptr(yp), i32(d), i32(704)])
    report(f"{prefix} n={n} bf16 out with fused RMSNorm", rel(host(yp), xn @ wp.T), 8e-3)
    w, wqd, wq, tail, verify = qkv_case(rng, n, 9, 3, 64, d, matrix)
    launch(m.fn(f"{prefix}_n{n}_qkv_rope_norm"), (math.ceil(w / 8),), 256, head + [ptr(wqd), i32(d), ptr(None)] + tail)
    verify(f"{prefix} n={n} qkv_rope with fused RMSNorm", xn @ wq.T)


def same_bytes(name, q, s, q_ref, s_ref):
    """Reports e4m3 rows and scales equal bit for bit to the unfused chain's."""
    report(f"{name} bytes equal to the two kernels'", float((q != q_ref).double().mean()), 1e-12)
    report(f"{name} scales equal to the two kernels'", float((s != s_ref).double().mean()), 1e-12)


def check_fused_producers(m, elementwise, rng):
    """rms_norm_e4m3 and *_mul_e4m3 against add_rms_norm / silu_mul /
    gelu_tanh_mul followed by quantize_rows_e4m3: the same bits."""
    quantize = m.fn("quantize_rows_e4m3")

    def quantized(x_bf16, rows, cols):
        q = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
        s = torch.empty(rows, dtype=torch.float32, device="cuda")
        launch(quantize, (rows,), 256, [ptr(x_bf16), ptr(q), ptr(s), i32(cols)])
        return q, s

    for rows, d in ((37, 4096), (5, 576), (3, 2048), (256, 4096)):
        x = dev(rnd(rng, rows, d, scale=2.0) * rng.uniform(0.1, 30.0, size=(rows, 1)), torch.float32)
        w = dev(1 + 0.2 * rnd(rng, d), torch.float32)
        threads = 512 if d >= 2048 else 256
        normed = torch.empty(rows, d, dtype=torch.bfloat16, device="cuda")
        launch(elementwise.fn("add_rms_norm"), (rows,), threads,
               [ptr(x), ptr(None), ptr(None), ptr(w), ptr(normed), i32(d), f32(1e-5)])
        q_ref, s_ref = quantized(normed, rows, d)
        q = torch.empty(rows, d, dtype=torch.uint8, device="cuda")
        s = torch.empty(rows, dtype=torch.float32, device="cuda")
        launch(m.fn("rms_norm_e4m3"), (rows,), threads, [ptr(x), ptr(w), ptr(q), ptr(s), i32(d), f32(1e-5)])
        same_bytes(f"rms_norm_e4m3 {rows}x{d}", q, s, q_ref, s_ref)
    for rows, ff in ((37, 14336), (4, 1536), (256, 12288)):
        gu = dev(rnd(rng, rows, 2 * ff, scale=4.0) * rng.uniform(0.1, 10.0, size=(rows, 1)), torch.bfloat16)
        for act in ("silu_mul", "gelu_tanh_mul"):
            out = torch.empty(rows, ff, dtype=torch.bfloat16, device="cuda")
            launch(elementwise.fn(act), (rows, math.ceil(ff / (8 * 256))), 256, [ptr(gu), ptr(out), i32(ff)])
            q_ref, s_ref = quantized(out, rows, ff)
            q = torch.empty(rows, ff, dtype=torch.uint8, device="cuda")
            s = torch.empty(rows, dtype=torch.float32, device="cuda")
            launch(m.fn(f"{act}_e4m3"), (rows,), 256, [ptr(gu), ptr(q), ptr(s), i32(ff)])
            same_bytes(f"{act}_e4m3 {rows}x{ff}", q, s, q_ref, s_ref)


def check_dequant_q8_0(m, rng):
    """dequant_q8_0_bf16: the bf16 expansion larger products multiply."""
    ll = ctypes.c_longlong
    for rows, cols, row0, n in ((7, 576, 0, 7), (300, 4096, 0, 300), (300, 4096, 37, 100)):
        wd, w = q8_0_matrix(rng, rows, cols)
        y = torch.empty(n, cols, dtype=torch.bfloat16, device="cuda")
        launch(m.fn("dequant_q8_0_bf16"), (min(4096, math.ceil(n * cols / 16 / 256)),), 256,
               [ptr(wd), ptr(y), ll(rows), i32(cols), ll(row0), ll(n)])
        report(f"dequant_q8_0_bf16 {rows}x{cols} rows {row0}+{n}", rel(host(y), w[row0:row0 + n]), 4e-3)


def check_q8_0(cubins, rng):
    """The native GGUF Q8_0 kernels: every GEMV mode at n = 1..8, the expansion."""
    gemv = ck.Module(os.path.join(cubins, "gemv.sm_90.cubin"))
    sizes = [(n, inp, out) for n, (inp, out) in zip(range(1, 9), [(576, 960), (1536, 576), (4096, 1000),
             (14336, 512), (2048, 768), (576, 64), (4096, 520), (8192, 100)])]
    check_gemv_fp8(gemv, rng, "q8_0", sizes)
    check_qkv_rope_fp8(gemv, rng, "q8_0")
    check_fused_norm_fp8(gemv, rng, "q8_0")
    check_dequant_q8_0(ck.Module(os.path.join(cubins, "quant.sm_90.cubin")), rng)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", required=True, help="folder with fp8/gemv/elementwise/quant .sm_90.cubin")
    ap.add_argument("--only", choices=["fp8", "q8_0"], help="one weight type's checks (default: fp8)")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")  # makes the primary context current for the driver calls
    rng = np.random.default_rng(0)
    if args.only == "q8_0":
        check_q8_0(args.cubins, rng)
        print(f"q8_0 kernel checks: {'all passed' if not ck.FAILS else 'FAILED: ' + ', '.join(ck.FAILS)}")
        sys.exit(1 if ck.FAILS else 0)
    fp8 = ck.Module(os.path.join(args.cubins, "fp8.sm_90.cubin"))
    gemv = ck.Module(os.path.join(args.cubins, "gemv.sm_90.cubin"))
    elementwise = ck.Module(os.path.join(args.cubins, "elementwise.sm_90.cubin"))
    check_quantize(fp8, rng)
    check_fused_producers(fp8, elementwise, rng)
    check_scale_out(fp8, rng)
    check_gemv_fp8(gemv, rng)
    check_qkv_rope_fp8(gemv, rng)
    check_fused_norm_fp8(gemv, rng)
    print(f"fp8 kernel checks: {'all passed' if not ck.FAILS else 'FAILED: ' + ', '.join(ck.FAILS)}")
    sys.exit(1 if ck.FAILS else 0)


if __name__ == "__main__":
    main()
