#!/usr/bin/env python3
"""Times the batch-1 GEMV kernels (gemv.cu) on the Llama-3.1-8B shapes, one
CUDA graph of back-to-back launches per kernel, each launch on the next of
enough weight copies that L2 (50 MiB) holds none of them: the kernel's own
DRAM bandwidth, without the engine's PDL overlap.

    python3 tests/gpu/bench_gemv.py --cubin DIR/gemv.sm_90.cubin [--cubin OTHER.cubin ...]
        [--only REGEX] [--launches 64]

Kernels are named as in gemv.cu (`gemv_fp8_n1_swiglu_norm`,
`gemv_q8_0_n1_add_f32`, ...) and gemv_kq.cu (`gemv_kq_n1_...`, timed on
Q4_K and, for down_proj and the LM head, Q6_K matrices: the shapes a
Q4_K_M file has); every cubin's kernels that match a shape's name pattern
are timed, and the candidates of tests/gpu/gemv_kq_variants.cu
(`x{a,f,s,q}k_...`). Prints one line per kernel: shape, µs per launch, weight bytes,
TB/s.
"""
import argparse
import ctypes
import os
import re
import struct

import torch

import check_kernels as ck
from check_kernels import Module, i32, ptr

H, KVH, HD, D, FF, VOCAB = 32, 8, 128, 4096, 14336, 128256
COPIES_BYTES = 400 << 20  # weight copies cycled per graph: 8x the L2


def f32(v):
    return ctypes.c_float(float(v))


def weights(rows, cols, kind):
    """Enough copies of a random `rows x cols` matrix in the loader's layout
    for `kind`: e4m3 bytes then f32 row scales at the next 256-byte
    boundary ("fp8"), int8 quants then f16 block scales there ("q8_0"), or
    bf16. Returns them and the bytes a kernel streams."""
    at = (rows * cols + 255) // 256 * 256
    one = {"fp8": at + rows * 4, "q8_0": at + rows * cols // 16}.get(kind, rows * cols * 2)
    copies = max(2, COPIES_BYTES // one + 1)
    bufs = []
    for _ in range(copies):
        if kind == "fp8":
            b = torch.randint(0, 0x70, (one,), dtype=torch.uint8, device="cuda")
            b[at:] = torch.full((rows,), 1e-3, dtype=torch.float32, device="cuda").view(torch.uint8)
        elif kind == "q8_0":
            b = torch.randint(0, 256, (one,), dtype=torch.uint8, device="cuda")
            b[at:] = torch.full((rows * cols // 32,), 1e-3, dtype=torch.float16, device="cuda").view(torch.uint8)
        else:
            b = (torch.rand(rows, cols, device="cuda") * 0.02 - 0.01).to(torch.bfloat16)
        bufs.append(b)
    return bufs, {"fp8": rows * cols, "q8_0": rows * cols // 32 * 34}.get(kind, rows * cols * 2)


# GGUF k-quant types as the device keeps them (kquant.cuh, weights/blocks.rs):
# GGML id, weights and bytes a block, bytes each plane takes of a block, and
# the f16 scale fields (offset in the plane, value) set to keep sums finite.
KQ_TYPES = {
    "q4_k": (12, 256, 144, [128, 16], (1, [(0, 2e-4), (2, 2e-4)])),
    "q6_k": (14, 256, 210, [128, 64, 16, 2], (3, [(0, 5e-5)])),
    "q4_1": (3, 32, 20, [16, 4], (1, [(0, 6e-3), (2, -0.045)])),
    "q5_k": (13, 256, 176, [128, 32, 16], (2, [(0, 2e-4), (2, 2e-4)])),
    "q4_0": (2, 32, 18, [16, 2], (1, [(0, 6e-3)])),
}


def kq_matrix(rows, cols, ty):
    """One random `rows x cols` matrix of `ty` in the device layout: a
    KqMatrix header (one segment), then the planes at 256-byte boundaries."""
    gid, unit, _, planes, (scale_plane, fields) = KQ_TYPES[ty]
    blocks = rows * cols // unit
    offs, at = [], 256
    for per in planes:
        offs.append(at)
        at = (at + blocks * per + 255) // 256 * 256
    b = torch.randint(0, 256, (at,), dtype=torch.uint8, device="cuda")
    per = planes[scale_plane]
    view = b[offs[scale_plane]:offs[scale_plane] + blocks * per].view(blocks, per)
    for off, v in fields:
        view[:, off:off + 2] = torch.full((blocks, 1), v, dtype=torch.float16, device="cuda").view(torch.uint8)
    header = struct.pack("<Qiiii", b.data_ptr() + 256, 0, rows, gid, 0) + b"\0" * 48 + struct.pack("<ii", 1, 0)
    b[:len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8).cuda()
    return b


def kq_weights(rows, cols, ty):
    one = rows * cols // KQ_TYPES[ty][1] * KQ_TYPES[ty][2]
    copies = max(2, COPIES_BYTES // one + 1)
    return [kq_matrix(rows, cols, ty) for _ in range(copies)], one


def kind_of(name):
    """The weight type a kernel reads (experimental `x{s,a,q}{f,b}_...`: f = fp8)."""
    if re.match(r"x[afsq]k_", name) or "_kq_" in name:
        return "kq"
    if name.startswith("x"):
        return {"f": "fp8", "8": "q8_0"}.get(name[2:3], "bf16")
    return "fp8" if "_fp8_" in name else "q8_0" if "_q8_0_" in name else "bf16"


def shape_args(shape, w, bufs):
    """Kernel arguments for one launch on weight buffer `w`."""
    x = bufs["x14336"] if shape == "down" else bufs["x4096"]
    if shape == "gate_up":
        return [ptr(x), f32(1e-5), ptr(bufs["sumsq"]), ptr(w), ptr(bufs["act"]), i32(D), i32(FF)]
    if shape == "lm_head":
        return [ptr(x), ptr(w), ptr(bufs["logits"]), i32(D), i32(VOCAB), ptr(None), ptr(None), ptr(None)]
    if shape in ("o_proj", "down"):
        return [ptr(x), ptr(w), ptr(bufs["resid"]), i32(FF if shape == "down" else D), i32(D),
                ptr(bufs["sumsq"]), ptr(bufs["g"]), ptr(bufs["xg"])]
    return [ptr(x), f32(1e-5), ptr(bufs["sumsq"]), ptr(w), i32(D), ptr(None), ptr(bufs["pos"]), ptr(bufs["slot"]),
            ptr(bufs["cos"]), ptr(bufs["sin"]), ptr(bufs["q"]), ptr(bufs["kc"]), ptr(bufs["vc"]), i32(H), i32(KVH),
            i32(HD), i32(16)]


SHAPES = {
    # name: (kernel-name pattern, weight rows, cols, grid blocks)
    "qkv": (r"qkv_rope_norm$|^xq", (H + 2 * KVH) * HD, D, (H + 2 * KVH) * HD // 8),
    "o_proj": (r"n1_add_f32$|^xa", D, D, D // 8),
    "gate_up": (r"n1_swiglu_norm$|^xs", 2 * FF, D, FF // 8),
    "down": (r"n1_add_f32$|^xa", D, FF, D // 8),
    "lm_head": (r"_kq_n1_f32$|^xfk", VOCAB, D, VOCAB // 8),
}
# The k-quant types each shape is timed in (a Q4_K_M file's).
KQ_OF_SHAPE = {"down": ["q4_k", "q6_k"], "lm_head": ["q6_k"]}


def launch_raw(f, grid, args, stream):
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    ck.ok(ck.cu.cuLaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, ctypes.c_void_p(stream), params, None), "launch")


def output_of(f, shape, grid, wbuf, bufs):
    """The kernel's output for one launch on `wbuf` (accumulators zeroed)."""
    bufs["resid"].zero_()
    bufs["act"].zero_()
    bufs["q"].zero_()
    launch_raw(f, grid, shape_args(shape, wbuf, bufs), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    key = {"o_proj": "resid", "down": "resid", "gate_up": "act", "lm_head": "logits"}.get(shape, "q")
    return bufs[key].float().clone()


def time_kernel(f, shape, grid, wbufs, bufs, launches):
    arg_sets = [shape_args(shape, wbufs[i % len(wbufs)], bufs) for i in range(launches)]
    for a in arg_sets[:2]:
        launch_raw(f, grid, a, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for a in arg_sets:
            launch_raw(f, grid, a, s.cuda_stream)
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        g.replay()
        t1.record()
        torch.cuda.synchronize()
        best = min(best, t0.elapsed_time(t1) * 1e3 / launches)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cubin", action="append", required=True,
                   help="PATH[:R]: R, the k-quant plain GEMVs' rows a warp at batch 1 (default 2, gemv.cuh plain_rows)")
    p.add_argument("--only", default="")
    p.add_argument("--launches", type=int, default=64)
    p.add_argument("--shape", default="", help="only shapes matching this regex (qkv, o_proj, gate_up, down, lm_head)")
    p.add_argument("--kq", default="", help="block types to time on every shape, comma-separated "
                   "(q4_k, q6_k, q4_1; default: a Q4_K_M file's per shape)")
    a = p.parse_args()
    bufs = {
        "x4096": (torch.randn(D, device="cuda") * 0.5).to(torch.bfloat16),
        "x14336": (torch.randn(FF, device="cuda") * 0.5).to(torch.bfloat16),
        "sumsq": ck.sumsq_buffer([float(D) * (1 - 1e-5)]),  # 1/rms = 1: the candidates without the norm compare equal
        "act": torch.empty(FF, dtype=torch.bfloat16, device="cuda"),
        "resid": torch.zeros(D, dtype=torch.float32, device="cuda"),
        "g": torch.ones(D, dtype=torch.float32, device="cuda"),
        "xg": torch.empty(D, dtype=torch.bfloat16, device="cuda"),
        "pos": torch.tensor([300], dtype=torch.int32, device="cuda"),
        "slot": torch.tensor([5], dtype=torch.int64, device="cuda"),
        "cos": torch.rand(4096 * HD // 2, device="cuda"),
        "sin": torch.rand(4096 * HD // 2, device="cuda"),
        "q": torch.empty(H * HD, dtype=torch.bfloat16, device="cuda"),
        "kc": torch.zeros(64 * KVH * HD, dtype=torch.bfloat16, device="cuda"),
        "vc": torch.zeros(64 * KVH * HD, dtype=torch.bfloat16, device="cuda"),
        "logits": torch.empty(VOCAB, dtype=torch.float32, device="cuda"),
    }
    cubins = [(c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1])) if re.search(r":\d+$", c) else (c, 2) for c in a.cubin]
    mods = [(path, Module(path), kq_rows) for path, kq_rows in cubins]
    print(f"{'shape':8} {'type':5} {'cubin':10} {'kernel':26} {'us':>8} {'MB':>7} {'TB/s':>6}")
    for shape, (pattern, rows, cols, _) in SHAPES.items():
        if not re.search(a.shape, shape):
            continue
        kinds = ["bf16", "fp8", "q8_0"] if shape != "lm_head" else []
        kq = a.kq.split(",") if a.kq else KQ_OF_SHAPE.get(shape, ["q4_k"])
        for kind in kinds + kq:
            wbufs, nbytes = None, 0
            for path, m, kq_rows in mods:
                names = kernel_names(m)
                for name in names:
                    if kind_of(name) != (kind if kind in ("bf16", "fp8", "q8_0") else "kq"):
                        continue
                    if not re.search(pattern, name) or not re.search(a.only, name):
                        continue
                    if wbufs is None:
                        wbufs, nbytes = kq_weights(rows, cols, kind) if kind in KQ_TYPES else weights(rows, cols, kind)
                        ref = None
                    f = m.fn(name)
                    grid = SHAPES[shape][3]
                    if kind in KQ_TYPES and re.search(r"_f32$|^x[af]k", name):
                        grid //= kq_rows  # rows a warp (gemv.cuh: plain_rows)
                    one_type = re.match(r"gemv_kq_(q\d_[0-9k])_n1_", name)
                    if one_type and one_type.group(1) != kind:
                        continue  # built for another type
                    if re.search(r"s(\d)$", name):
                        grid *= int(name[-1])  # that many warps a row pair (split inputs)
                    per_warp = re.search(r"c(\d)$", name)
                    if per_warp or one_type:
                        grid = -(-grid // int(per_warp.group(1) if per_warp else 2))  # gate/up columns a warp
                    y = output_of(f, shape, grid, wbufs[0], bufs)
                    ref = y if ref is None else ref
                    err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                    us = time_kernel(f, shape, grid, wbufs, bufs, a.launches)
                    tag = os.path.basename(os.path.dirname(os.path.abspath(path)))[-10:]
                    print(f"{shape:8} {kind:5} {tag:10} {name:26} {us:8.2f} {nbytes / 1e6:7.1f} "
                          f"{nbytes / us / 1e6:6.2f}  vs first: {err:.1e}", flush=True)
            del wbufs
            torch.cuda.empty_cache()


# gemv_kq_variants.cu's variant tags; `cN`: N gate/up columns a warp.
KQ_VARIANTS = ("r0u1", "r0u2", "t4u1", "t4u2", "t4b4", "t6u1", "t6b3", "t4c2", "t4c3", "t4c4", "r0c2", "t6u2", "r0s2", "t4s2", "t6s2")


def kernel_names(m):
    """The candidate kernels this module has: gemv.cu's batch-1 ones and any
    experimental variants `x{s,a,q}{f,b,8}_u{U}_p{P}` (gated / accumulate /
    q/k/v; FP8, bf16 or Q8_0 weights; U loads a row in flight; P: L2 prefetch)."""
    cands = [f"{p}_n1_{k}" for p in ("gemv", "gemv_fp8", "gemv_q8_0", "gemv_kq")
             for k in ("qkv_rope_norm", "add_f32", "swiglu_norm", "f32")]
    cands += [f"x{k}{d}_u{u}_p{p}" for k in "saq" for d in "fb8" for u in (1, 2, 4, 8) for p in (0, 1)]
    cands += [f"x{k}k_{t}" for k in "afsq" for t in KQ_VARIANTS]
    cands += [f"gemv_kq_{t}_n1_swiglu_norm" for t in KQ_TYPES]
    out = []
    for name in cands:
        f = ctypes.c_void_p()
        if ck.cu.cuModuleGetFunction(ctypes.byref(f), m.handle, name.encode()) == 0:
            out.append(name)
    return out


if __name__ == "__main__":
    main()
