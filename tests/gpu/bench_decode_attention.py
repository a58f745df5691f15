#!/usr/bin/env python3
"""Times the decode attention kernels alone (`paged_attention{,_tc}{,_fp8}_hd128_g4`
and, with several splits, `attention_combine`) from one or more attention cubins,
so kernel versions and split counts compare in one device call without a binary
each:

    python3 tests/gpu/bench_decode_attention.py main=DIR_A:old new=DIR_B

Each version is LABEL=DIR[:FLAG...] (DIR holds attention.sm_90.cubin): `:old` for
cubins from before att22 (the FP8 tensor-core kernel's shared memory had
another size), `:kvfirst` for a tensor-core kernel whose grid is (kv heads,
rows, splits). Shape: the 8B's heads (32 query heads, 8 kv
heads, head_dim 128, 16-slot blocks), ROWS decode rows of CTX keys each, pages
scattered over the pool (as a long-running server's are), one layer per launch
(the pool is far larger than L2). Prints the mean time per launch (attention +
combine), the K/V bytes over that time, and the largest difference from the
first version's one-split output.
"""
import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_kernels import Module, cu, f32, i32, ok, time_launches  # noqa: E402

BS, H, KVH, HD = 16, 32, 8, 128


def tc_smem(fp8, before_att22=False):
    """DecodeTcSmem::BYTES: 4 warps; bf16: 3 stages of K/V tiles with rows padded
    by 8 elements; FP8: 4 raw stages, rows padded by 16 bytes (before att22: raw
    rows unpadded plus one padded bf16 pair to convert into)."""
    if not fp8:
        return 4 * 3 * 2 * 16 * (HD + 8) * 2
    if before_att22:
        return 4 * (4 * 2 * 16 * HD + 2 * 16 * (HD + 8) * 2)
    return 4 * 4 * 2 * 16 * (HD + 16)


class Inputs:
    def __init__(self, rows, ctx, kv_dtype, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.rows, self.ctx = rows, ctx
        nb = math.ceil(ctx / BS)
        perm = torch.randperm(rows * nb, generator=g, device="cuda").to(torch.int32)
        self.table = perm.reshape(rows, nb).reshape(-1).contiguous()
        self.stride = torch.tensor([nb], dtype=torch.int32, device="cuda")
        shape = (rows * nb, KVH, BS, HD)
        self.k = torch.randn(shape, generator=g, device="cuda").mul(1.5).to(kv_dtype)
        self.v = torch.randn(shape, generator=g, device="cuda").to(kv_dtype)
        self.q = torch.randn(rows, H * HD, generator=g, device="cuda").to(torch.bfloat16)
        self.seq = torch.arange(rows, dtype=torch.int32, device="cuda")
        self.pos = torch.full((rows,), ctx - 1, dtype=torch.int32, device="cuda")
        self.kv_bytes = 2 * rows * KVH * ctx * HD * self.k.element_size()


class Version:
    def __init__(self, spec):
        label, rest = spec.split("=", 1)
        path, *flags = rest.split(":")
        self.label = label
        self.tc_smem = [tc_smem(False), tc_smem(True, "old" in flags)]
        self.kv_first = "kvfirst" in flags  # tensor-core grid (kv heads, rows, splits)
        self.module = Module(os.path.join(path, "attention.sm_90.cubin"))

    def launcher(self, inp, fp8, tc, splits):
        infix = "_fp8" if fp8 else ""
        fn = self.module.fn(f"paged_attention{'_tc' if tc else ''}{infix}_hd{HD}_g{H // KVH}")
        combine = self.module.fn("attention_combine")
        smem = self.tc_smem[1 if fp8 else 0] if tc else 0
        if smem:
            ok(cu.cuFuncSetAttribute(fn, 8, smem), "set max dynamic smem")
        regs, blocks = ctypes.c_int(), ctypes.c_int()
        ok(cu.cuFuncGetAttribute(ctypes.byref(regs), 4, fn), "registers")
        ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), fn, 128, ctypes.c_size_t(smem)),
           "occupancy")
        self.resident = f"{regs.value}r/{blocks.value}b"
        out = torch.zeros_like(inp.q)
        part_acc = torch.zeros(inp.rows * H * splits * HD, dtype=torch.float32, device="cuda")
        part_ml = torch.zeros(inp.rows * H * splits * 2, dtype=torch.float32, device="cuda")
        p = lambda t: ctypes.c_uint64(t.data_ptr())  # noqa: E731
        null = ctypes.c_uint64(0)
        args = [p(inp.q), p(inp.k), p(inp.v), p(inp.table), p(inp.stride), p(inp.seq), p(inp.pos), null, p(out),
                p(part_acc), p(part_ml), i32(H), i32(KVH), i32(BS), f32(math.log2(math.e) / math.sqrt(HD)),
                i32(splits), null, ctypes.c_uint64(0), i32(0), i32(0)]
        cargs = [p(part_acc), p(part_ml), null, p(out), i32(H), i32(HD), i32(splits)]
        keep = [out, part_acc, part_ml, args, cargs]
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        cparams = (ctypes.c_void_p * len(cargs))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in cargs])
        keep += [params, cparams]

        def run():
            gx, gy = (KVH, inp.rows) if tc and self.kv_first else (inp.rows, KVH)
            ok(cu.cuLaunchKernel(fn, gx, gy, splits, 128, 1, 1, smem, None, params, None), "launch")
            if splits > 1:
                ok(cu.cuLaunchKernel(combine, inp.rows, H, 1, 128, 1, 1, 0, None, cparams, None), "combine")

        return run, out, keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+", help="LABEL=DIR[:old][:kvfirst]")
    ap.add_argument("--rows", default="256,64", help="decode rows, comma-separated")
    ap.add_argument("--ctx", type=int, default=1088, help="keys per row (the 256 x 1k run's mean)")
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kv", choices=["both", "fp8", "bf16"], default="both")
    ap.add_argument("--kernel", choices=["both", "tc", "simt"], default="both")
    ap.add_argument("--once", action="store_true", help="one launch per case (for ncu)")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")  # makes the primary context current for the driver calls
    versions = [Version(s) for s in args.versions]
    print(f"{'rows':>4} {'kv':5} {'kernel':5} {'splits':>6} {'version':8} {'us':>8} {'TB/s':>6} {'max diff':>9} regs/blocks per SM")
    for rows in [int(r) for r in args.rows.split(",")]:
        for fp8 in [f for f in (True, False) if args.kv in ("both", "fp8" if f else "bf16")]:
            inp = Inputs(rows, args.ctx, torch.float8_e4m3fn if fp8 else torch.bfloat16)
            for tc in [t for t in (True, False) if args.kernel in ("both", "tc" if t else "simt")]:
                first = None
                for splits in [int(s) for s in args.splits.split(",")]:
                    for v in versions:
                        run, out, _keep = v.launcher(inp, fp8, tc, splits)
                        us = time_launches(run, args.iters, args.once)
                        res = out.float()
                        diff = 0.0 if first is None else float((res - first).abs().max() / first.abs().max())
                        first = res if first is None else first
                        print(f"{rows:4} {'fp8' if fp8 else 'bf16':5} {'tc' if tc else 'simt':5} {splits:6} "
                              f"{v.label:8} {us:8.1f} {inp.kv_bytes / us / 1e6:6.2f} {diff:9.1e} {v.resident}",
                              flush=True)
            del inp
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
