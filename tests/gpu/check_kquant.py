#!/usr/bin/env python3
"""Checks the kernels that read GGUF Q4_0, Q4_1, Q4_K, Q5_K and Q6_K blocks
as they are (`--cuda-weights native`: gemv_kq_* in gemv_kq.cu, the
expansion dequant_kq_bf16 in quant.cu, the lookup embed_kq in
elementwise.cu) against float64 products of the same blocks dequantized by
llama.cpp's own gguf-py (`gguf.quants.dequantize`, from the llama.cpp
source the `lcpp` phase unpacks): every GEMV mode at n = 1..8, the q/k/v
rope mode on a matrix whose v rows are Q6_K and q/k rows Q4_K (two row
segments, as a Q4_K_M file's), the batch-1 gated kernels built for one type, the expansion of a whole
matrix and of a row chunk, and the embedding lookup. Blocks are random bytes with f16 scales
set to sizes that give weights of ~0.05; the device layout (a header of
row segments, then each field of the blocks as a plane at a 256-byte
boundary) is built here from the description in kquant.cuh, not by the
Rust loader, so a loader bug and a kernel bug cannot cancel.

    PYTHONPATH=.gpu-lcpp/src/llama.cpp/gguf-py python3 tests/gpu/check_kquant.py --cubins DIR

Prints one line per check and exits 1 if any fails.
"""
import argparse
import ctypes
import math
import os
import struct
import sys

import numpy as np
import torch

import check_kernels as ck
from check_fp8 import KINDS, check_fused_norm_fp8, check_gemv_fp8, qkv_case
from check_kernels import bf, dev, f32, host, i32, launch, ptr, rel, report, rnd

try:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
except ImportError:
    sys.exit("check_kquant.py needs llama.cpp's gguf-py on PYTHONPATH (run the lcpp phase first)")

# type: (GGML id, weights a block, bytes a block, planes as (bytes, offset in the block),
#        f16 scale fields as (offset, typical value))
TYPES = {
    "q4_0": (2, 32, 18, [(16, 2), (2, 0)], [(0, 6e-3)]),
    "q4_1": (3, 32, 20, [(16, 4), (4, 0)], [(0, 6e-3), (2, -0.045)]),
    "q4_k": (12, 256, 144, [(128, 16), (16, 0)], [(0, 1e-4), (2, 2e-4)]),
    "q5_k": (13, 256, 176, [(128, 48), (32, 16), (16, 0)], [(0, 5e-5), (2, 2e-4)]),
    "q6_k": (14, 256, 210, [(128, 0), (64, 128), (16, 192), (2, 208)], [(208, 2.5e-5)]),
}


def align(n):
    return (n + 255) // 256 * 256


def blocks(rng, ty, rows, cols):
    """Random blocks of `ty` for a rows x cols matrix, and their float64 values."""
    gid, unit, size, _, scales = TYPES[ty]
    raw = rng.integers(0, 256, size=(rows * cols // unit, size), dtype=np.uint8)
    for at, v in scales:
        d = (v * rng.uniform(0.5, 1.5, size=len(raw))).astype(np.float16)
        raw[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    w = dequantize(raw.reshape(-1), GGMLQuantizationType(gid)).reshape(rows, cols).astype(np.float64)
    return raw, w


def kq_device(segments, cols):
    """The device matrix of row segments [(type, raw blocks, rows)]: the
    KqMatrix header, then each segment's planes."""
    at, placed = 256, []
    for ty, raw, rows in segments:
        at = align(at)
        start, planes = at, []
        for nbytes, off in TYPES[ty][3]:
            at = align(at) if planes else at
            plane = np.ascontiguousarray(raw[:, off:off + nbytes]).reshape(-1)
            planes.append((at, plane))
            at += len(plane)
        placed.append((ty, rows, start, planes))
    buf = torch.zeros(at, dtype=torch.uint8, device="cuda")
    base = buf.data_ptr()
    image = np.zeros(at, dtype=np.uint8)
    header, row = b"", 0
    for ty, rows, start, planes in placed:
        header += struct.pack("<Qiiii", base + start, row, rows, TYPES[ty][0], 0)
        row += rows
        for off, plane in planes:
            image[off:off + len(plane)] = plane
    header += b"\0" * 24 * (3 - len(placed)) + struct.pack("<ii", len(placed), 0)
    image[:len(header)] = np.frombuffer(header, dtype=np.uint8)
    buf.copy_(torch.from_numpy(image))
    return buf


def matrix_of(ty):
    def make(rng, rows, cols, scale=None):
        raw, w = blocks(rng, ty, rows, cols)
        return kq_device([(ty, raw, rows)], cols), w
    return make


def mixed(split):
    """Q4_K rows then, from row split(rows), Q6_K rows (a Q4_K_M q/k/v)."""
    def make(rng, rows, cols, scale=None):
        s = split(rows)
        (ra, wa), (rb, wb) = blocks(rng, "q4_k", s, cols), blocks(rng, "q6_k", rows - s, cols)
        return kq_device([("q4_k", ra, s), ("q6_k", rb, rows - s)], cols), np.concatenate([wa, wb])
    return make


def check_dequant(m, rng, ty):
    ll = ctypes.c_longlong
    for rows, cols, row0, n in ((7, 1024, 0, 7), (300, 4096, 0, 300), (300, 4096, 37, 100)):
        wd, w = matrix_of(ty)(rng, rows, cols)
        y = torch.empty(n, cols, dtype=torch.bfloat16, device="cuda")
        launch(m.fn("dequant_kq_bf16"), (min(4096, math.ceil(n * cols / 32 / 256)),), 256,
               [ptr(wd), ptr(y), ll(rows), i32(cols), ll(row0), ll(n)])
        report(f"dequant_kq_bf16 {ty} {rows}x{cols} rows {row0}+{n}", rel(host(y), w[row0:row0 + n]), 4e-3)


def check_embed(m, rng, ty):
    vocab, d, n = 300, 1024, 5
    wd, w = matrix_of(ty)(rng, vocab, d)
    ids = rng.integers(0, vocab, n)
    x = torch.empty(n, d, dtype=torch.float32, device="cuda")
    g = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    xg = torch.empty(n, d, dtype=torch.bfloat16, device="cuda")
    ssb = ck.sumsq_buffer()
    launch(m.fn("embed_kq"), (n,), 256, [ptr(dev(ids, torch.int32)), ptr(wd), ptr(x), i32(d), ptr(ssb),
                                         ptr(dev(g, torch.float32)), ptr(xg), f32(2.0)])
    want = 2.0 * w[ids]
    report(f"embed_kq {ty}", rel(host(x), want), 1e-6)
    report(f"embed_kq {ty}: pre-scaled norm input", rel(host(xg), want * g), 8e-3)
    got, _ = ck.sumsq_rows(ssb, n)
    report(f"embed_kq {ty}: sums of squares", rel(got, (want ** 2).sum(-1)), 1e-5)


# The types with batch-1 gated kernels of their own (gemv_kq.cu KQ_GATED_KERNELS).
ONE_TYPE_GATED = ("q4_0", "q4_1", "q4_k")


def check_gated_one_type(m, rng, ty, d=1024, ff=1536):
    """Batch 1's gated GEMVs built for one type (gemv_kq_{ty}_n1_*: two
    gate/up columns a warp, half the grid), with and without the fused
    RMSNorm; ff odd leaves the last warp one column."""
    eps = 1e-5
    x = rnd(rng, 1, d, scale=3.0).astype(np.float32).astype(np.float64)
    nw = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    xg = bf(x * nw)
    xn = xg / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    ssb = ck.sumsq_buffer((x ** 2).sum(-1))
    for cols in (ff, 97):
        wd, w2 = matrix_of(ty)(rng, 2 * cols, d)
        grid = (math.ceil(cols / 16),)
        y = torch.empty(1, cols, dtype=torch.bfloat16, device="cuda")
        for norm, xin in ((False, xg), (True, xn)):
            gate, up = xin @ w2[:cols].T, xin @ w2[cols:].T
            head = [ptr(dev(xg, torch.bfloat16))] + ([f32(eps), ptr(ssb)] if norm else [])
            for act, f in (("swiglu", gate / (1 + np.exp(-gate)) * up), ("geglu", ck.gelu_tanh(gate) * up)):
                name = f"gemv_kq_{ty}_n1_{act}{'_norm' if norm else ''}"
                y.fill_(float("nan"))
                launch(m.fn(name), grid, 256, head + [ptr(wd), ptr(y), i32(d), i32(cols)])
                report(f"{name} {d}->{cols}", rel(host(y), f), 8e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", required=True, help="folder with gemv_kq/quant/elementwise .sm_90.cubin")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    rng = np.random.default_rng(0)
    gemv = ck.Module(os.path.join(args.cubins, "gemv_kq.sm_90.cubin"))
    quant = ck.Module(os.path.join(args.cubins, "quant.sm_90.cubin"))
    elementwise = ck.Module(os.path.join(args.cubins, "elementwise.sm_90.cubin"))
    sizes = [(n, inp, out) for n, (inp, out) in zip(range(1, 9), [(1024, 960), (1536, 512), (4096, 1000),
             (14336, 512), (2048, 768), (512, 64), (4096, 520), (8192, 100)])]
    for ty in TYPES:
        KINDS[ty] = ("gemv_kq", matrix_of(ty))
        check_gemv_fp8(gemv, rng, ty, sizes)
        check_fused_norm_fp8(gemv, rng, ty, d=1024, ff=1536)
        check_fused_norm_fp8(gemv, rng, ty, d=1024, ff=1536, n=1)
        check_gemv_fp8(gemv, rng, ty, [(1, 2048, 97)])  # an odd row count: the last pair is half
        if ty in ONE_TYPE_GATED:
            check_gated_one_type(gemv, rng, ty)
        check_dequant(quant, rng, ty)
        check_embed(elementwise, rng, ty)
    for n, H, KVH, hd, d in ((1, 9, 3, 64, 1024), (4, 32, 8, 128, 4096), (8, 16, 4, 128, 2048)):
        KINDS["mixed"] = ("gemv_kq", mixed(lambda rows, q=(H + KVH) * hd: q))
        w, wqd, wq, tail, verify = qkv_case(rng, n, H, KVH, hd, d, KINDS["mixed"][1])
        x = bf(rnd(rng, n, d))
        launch(gemv.fn(f"gemv_kq_n{n}_qkv_rope"), (math.ceil(w / 8),), 256,
               [ptr(dev(x, torch.bfloat16)), ptr(wqd), i32(d), ptr(None)] + tail)
        verify(f"gemv_kq qkv_rope n={n} H={H} KVH={KVH} hd={hd} (q/k Q4_K, v Q6_K)", x @ wq.T)
    print(f"k-quant kernel checks: {'all passed' if not ck.FAILS else 'FAILED: ' + ', '.join(ck.FAILS)}")
    sys.exit(1 if ck.FAILS else 0)


if __name__ == "__main__":
    main()
