#!/usr/bin/env python3
"""Checks every ingot CUDA kernel against a float64 NumPy reference on random
inputs (never zeros). Loads the cubins that build.rs embedded (copied next to
the binary by scripts/gpu-bundle) through the driver API, with PyTorch only
allocating device memory.

    python3 tests/gpu/check_kernels.py --cubins DIR

Prints one line per check and exits 1 if any fails.
"""
import argparse
import ctypes
import itertools
import math
import os
import sys
import zlib

import numpy as np
import torch

cu = ctypes.CDLL("libcuda.so.1")
FAILS = []


def ok(r, what):
    if r != 0:
        raise RuntimeError(f"{what} failed with CUresult {r}")


class Module:
    def __init__(self, path):
        self.handle = ctypes.c_void_p()
        data = open(path, "rb").read()
        ok(cu.cuModuleLoadData(ctypes.byref(self.handle), data), f"load {path}")

    def fn(self, name):
        f = ctypes.c_void_p()
        ok(cu.cuModuleGetFunction(ctypes.byref(f), self.handle, name.encode()), f"get {name}")
        return f


KEEP = []  # tensors passed to kernels stay alive (and unaliased) until exit


def ptr(t):
    if t is None:
        return ctypes.c_uint64(0)
    KEEP.append(t)
    return ctypes.c_uint64(t.data_ptr())


def launch(f, grid, block, args, smem=0):
    if smem:
        ok(cu.cuFuncSetAttribute(f, 8, smem), "set max dynamic smem")
    holders = list(args)
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in holders])
    g = tuple(grid) + (1,) * (3 - len(grid))
    ok(cu.cuLaunchKernel(f, g[0], g[1], g[2], block, 1, 1, smem, None, params, None), "launch")
    torch.cuda.synchronize()


def time_launches(run, iters, once=False):
    """Mean microseconds of `run()` over `iters` calls, after 3 warm-up calls (the kernel benchmarks);
    with `once`, one call and no timing (NaN: an ncu profile counts that launch)."""
    if once:
        run()
        torch.cuda.synchronize()
        return float("nan")
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # microseconds


def i32(v):
    return ctypes.c_int(int(v))


def f32(v):
    return ctypes.c_float(float(v))


def report(name, err, tol):
    status = "ok" if err < tol else "FAIL"
    if status == "FAIL":
        FAILS.append(name)
    print(f"{status:4} {name:55} max rel err {err:.2e} (tol {tol:.0e})")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def dev(a, dtype):
    return torch.tensor(np.asarray(a), dtype=torch.float64).to(dtype).cuda()


def host(t):
    return t.float().cpu().numpy().astype(np.float64)


def rnd(rng, *shape, scale=1.0):
    # Uniform in ±scale, never exactly zero.
    x = rng.uniform(-scale, scale, size=shape)
    x[x == 0] = scale / 3
    return x


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def bf(x):
    """Rounds through bf16 (what the kernel actually reads)."""
    return torch.tensor(x, dtype=torch.float64).to(torch.bfloat16).double().numpy()


def check_elementwise(m, rng):
    # embed_rows
    V, d, T = 1000, 576, 37
    table = bf(rnd(rng, V, d))
    ids = rng.integers(0, V, T)
    x = torch.empty(T, d, dtype=torch.float32, device="cuda")
    ssb = sumsq_buffer()
    g = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    xg = torch.empty(T, d, dtype=torch.bfloat16, device="cuda")
    launch(m.fn("embed_rows"), (T,), 256, [ptr(dev(ids, torch.int32)), ptr(dev(table, torch.bfloat16)), ptr(x), i32(d), ptr(ssb),
                                           ptr(dev(g, torch.float32)), ptr(xg)])
    report("embed_rows", rel(host(x), table[ids]), 1e-7)
    report("embed_rows pre-scaled bf16 copy (x * norm weight)", rel(host(xg), table[ids] * g), 4e-3)
    got, blocks = sumsq_rows(ssb, 8)
    report("embed_rows sums of squares (first 8 rows)", rel(got, (table[ids[:8]] ** 2).sum(-1)), 1e-5)
    report("embed_rows sums of squares: one partial per row", abs(blocks - 1), 0.5)
    scale = math.sqrt(640.0)
    ssb = sumsq_buffer()
    launch(m.fn("embed_rows_scaled"), (T,), 256, [ptr(dev(ids, torch.int32)), ptr(dev(table, torch.bfloat16)), ptr(x), i32(d),
                                                  ptr(ssb), ptr(dev(g, torch.float32)), ptr(xg), f32(scale)])
    want = table[ids] * np.float32(scale)
    report("embed_rows_scaled (x sqrt(640))", rel(host(x), want), 1e-6)
    report("embed_rows_scaled pre-scaled bf16 copy", rel(host(xg), want * g), 4e-3)
    got, _ = sumsq_rows(ssb, 8)
    report("embed_rows_scaled sums of squares", rel(got, (want[:8] ** 2).sum(-1)), 1e-5)

    # post_norm_add: x += rmsnorm(y) * post, then the next norm's input, in
    # both forms (pre-scaled + sums of squares; normed).
    for d in (640, 2304):
        x0 = rnd(rng, T, d, scale=20.0).astype(np.float32).astype(np.float64)
        y = rnd(rng, T, d, scale=3.0).astype(np.float32).astype(np.float64)
        post = (1 + 0.5 * rnd(rng, d)).astype(np.float32).astype(np.float64)
        nxt = (1 + 0.5 * rnd(rng, d)).astype(np.float32).astype(np.float64)
        xs = x0 + y / np.sqrt((y ** 2).mean(-1, keepdims=True) + 1e-6) * post
        for fused in (True, False):
            xd, xn = dev(x0, torch.float32), torch.empty(T, d, dtype=torch.bfloat16, device="cuda")
            ssb = sumsq_buffer()
            launch(m.fn("post_norm_add"), (T,), 256, [ptr(xd), ptr(dev(y, torch.float32)), ptr(dev(post, torch.float32)), i32(d),
                                                      f32(1e-6), ptr(dev(nxt, torch.float32)), ptr(ssb if fused else None), ptr(xn)])
            report(f"post_norm_add d={d} residual", rel(host(xd), xs), 1e-6)
            if fused:
                report(f"post_norm_add d={d} pre-scaled next input", rel(host(xn), xs * nxt), 4e-3)
                got, blocks = sumsq_rows(ssb, 8)
                report(f"post_norm_add d={d} sums of squares", rel(got, (xs[:8] ** 2).sum(-1)) + abs(blocks - 1), 1e-5)
            else:
                ref = xs / np.sqrt((xs ** 2).mean(-1, keepdims=True) + 1e-6) * nxt
                report(f"post_norm_add d={d} normed next input", rel(host(xn), ref), 8e-3)

    # softcap_rows
    lg = rnd(rng, 3, 5000, scale=200.0).astype(np.float32).astype(np.float64)
    lgd = dev(lg, torch.float32)
    launch(m.fn("softcap_rows"), (20,), 256, [ptr(lgd), ctypes.c_longlong(lg.size), f32(30.0)])
    report("softcap_rows (cap 30)", rel(host(lgd), 30.0 * np.tanh(lg / 30.0)), 1e-5)

    # add_rms_norm: residual add + norm, then the gather form; 576/4096 take
    # the register path, 1030 (not a multiple of 4) and 8200 (over 16 per
    # thread) the loop.
    for d in (576, 4096, 1030, 8200):
        x0 = rnd(rng, T, d, scale=2.0).astype(np.float32).astype(np.float64)
        delta = bf(rnd(rng, T, d))
        w = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
        xd, out = dev(x0, torch.float32), torch.empty(T, d, dtype=torch.bfloat16, device="cuda")
        threads = 512 if d >= 2048 else 256
        launch(m.fn("add_rms_norm"), (T,), threads,
               [ptr(xd), ptr(dev(delta, torch.bfloat16)), ptr(None), ptr(dev(w, torch.float32)), ptr(out), i32(d), f32(1e-5)])
        xs = x0 + delta
        ref = xs / np.sqrt((xs ** 2).mean(-1, keepdims=True) + 1e-5) * w
        report(f"add_rms_norm d={d} (residual written back)", rel(host(xd), xs), 1e-6)
        report(f"add_rms_norm d={d} (normed, bf16 out)", rel(host(out), ref), 8e-3)
        rows = rng.permutation(T)[:5]
        out2 = torch.empty(5, d, dtype=torch.bfloat16, device="cuda")
        xd2 = dev(x0, torch.float32)
        launch(m.fn("add_rms_norm"), (5,), threads,
               [ptr(xd2), ptr(dev(delta, torch.bfloat16)), ptr(dev(rows, torch.int32)), ptr(dev(w, torch.float32)), ptr(out2), i32(d), f32(1e-5)])
        report(f"add_rms_norm d={d} gather rows", rel(host(out2), ref[rows]), 8e-3)
        out3 = torch.empty(T, d, dtype=torch.bfloat16, device="cuda")
        launch(m.fn("add_rms_norm"), (T,), threads,
               [ptr(dev(x0, torch.float32)), ptr(None), ptr(None), ptr(dev(w, torch.float32)), ptr(out3), i32(d), f32(1e-5)])
        ref0 = x0 / np.sqrt((x0 ** 2).mean(-1, keepdims=True) + 1e-5) * w
        report(f"add_rms_norm d={d} without residual add", rel(host(out3), ref0), 8e-3)

    # silu_mul
    ff = 1536
    gu = bf(rnd(rng, T, 2 * ff, scale=4.0))
    out = torch.empty(T, ff, dtype=torch.bfloat16, device="cuda")
    launch(m.fn("silu_mul"), (T, math.ceil(ff / (8 * 256))), 256, [ptr(dev(gu, torch.bfloat16)), ptr(out), i32(ff)])
    g, u = gu[:, :ff], gu[:, ff:]
    report("silu_mul", rel(host(out), g / (1 + np.exp(-g)) * u), 8e-3)
    launch(m.fn("gelu_tanh_mul"), (T, math.ceil(ff / (8 * 256))), 256, [ptr(dev(gu, torch.bfloat16)), ptr(out), i32(ff)])
    report("gelu_tanh_mul", rel(host(out), gelu_tanh(g) * u), 8e-3)

    # fill_uniform_bf16: range and moments of offset + scale * U(-0.5, 0.5)
    n = 1 << 20
    buf = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    whole = [ctypes.c_longlong(n), ctypes.c_longlong(1), ctypes.c_longlong(1), ctypes.c_longlong(0)]
    launch(m.fn("fill_uniform_bf16"), (1024,), 256, [ptr(buf), ctypes.c_longlong(n), ctypes.c_ulonglong(7), f32(0.2), f32(1.0)] + whole)
    v = host(buf)
    err = max(abs(v.mean() - 1.0) / 0.2, abs(v.std() - 0.2 / math.sqrt(12)) / 0.2, float(v.min() < 0.89 or v.max() > 1.11))  # bf16 spacing near 1 is 2^-7
    report("fill_uniform_bf16 (mean, std, range)", err, 1e-2)

    # A tensor-parallel rank's slice of a [3, 64, 40] tensor (dim 1, rows
    # 16..48) holds the whole tensor's values there, whichever dim is split.
    full = torch.empty(3 * 64 * 40, dtype=torch.float32, device="cuda")
    args = lambda out, count, inner, length, whole_len, start: [ptr(out), ctypes.c_longlong(count), ctypes.c_ulonglong(11), f32(0.08), f32(0.0), ctypes.c_longlong(inner), ctypes.c_longlong(length), ctypes.c_longlong(whole_len), ctypes.c_longlong(start)]
    launch(m.fn("fill_uniform_f32"), (64,), 256, args(full, full.numel(), full.numel(), 1, 1, 0))
    want = host(full).reshape(3, 64, 40)
    worst = 0.0
    for dim, start, length in [(1, 16, 32), (2, 8, 16), (0, 1, 2)]:
        shape = list(want.shape)
        shape[dim] = length
        part = torch.empty(int(np.prod(shape)), dtype=torch.float32, device="cuda")
        inner = int(np.prod(want.shape[dim + 1:]))
        launch(m.fn("fill_uniform_f32"), (64,), 256, args(part, part.numel(), inner, length, want.shape[dim], start))
        expect = np.take(want, range(start, start + length), axis=dim)
        worst = max(worst, float(np.abs(host(part).reshape(shape) - expect).max()))
    report("fill_uniform_f32 (a rank's slice equals the whole tensor's)", worst, 1e-30)



def launch_on(f, grid, block, args, stream):
    """As launch, on `stream` and without waiting."""
    holders = list(args)
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in holders])
    KEEP.append((holders, params))
    g = tuple(grid) + (1,) * (3 - len(grid))
    ok(cu.cuLaunchKernel(f, g[0], g[1], g[2], block, 1, 1, 0, ctypes.c_void_p(stream), params, None), "launch")


def check_collective(m, rng):
    # gather_vocab_shards: 3 ranks' [rows, vocab_rows] logits, rank-major, into [rows, vocab].
    rows, vocab, ranks = 5, 1000, 3
    vrows = math.ceil(vocab / ranks)
    shards = rnd(rng, ranks, rows, vrows)
    logits = torch.full((rows, vocab), float("nan"), dtype=torch.float32, device="cuda")
    launch(m.fn("gather_vocab_shards"), (math.ceil(vocab / 256), rows), 256, [ptr(dev(shards, torch.float32)), ptr(logits), i32(rows), i32(vocab), i32(vrows)])
    want = np.concatenate(list(shards.astype(np.float32)), axis=1)[:, :vocab]
    report("gather_vocab_shards", float(np.abs(host(logits) - want).max()), 1e-30)

    # all_reduce_oneshot_f32: ranks on one GPU, each on its own stream at once (their blocks wait
    # for each other's flags), several calls in a row (epochs, both exchange halves), sizes that
    # leave partial chunks: every rank holds the f32 sum taken in rank order, the same bits.
    f = m.fn("all_reduce_oneshot_f32")
    for ranks in (2, 4):
        half = 1 << 19
        exch = [torch.zeros(2 * half, dtype=torch.float32, device="cuda") for _ in range(ranks)]
        flags = [torch.zeros(256 * ranks, dtype=torch.int32, device="cuda") for _ in range(ranks)]
        epochs = [torch.zeros(256, dtype=torch.int32, device="cuda") for _ in range(ranks)]
        table = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device="cuda")
        ex_t, fl_t = table(exch), table(flags)
        streams = [torch.cuda.Stream() for _ in range(ranks)]
        worst, same = 0.0, True
        for rows, d, per_row, fuse in [(1, 8192, 8, True), (3, 4096, 4, True), (8, 2000, 2, False), (1, 8192, 8, False), (16, 4096, 16, False), (2, 4, 1, True)]:
            n = rows * d
            xs = [torch.tensor(rnd(rng, n), dtype=torch.float32, device="cuda") for _ in range(ranks)]
            want = xs[0].double().cpu().numpy().astype(np.float32)
            for x in xs[1:]:
                want = want + x.cpu().numpy()
            g = torch.tensor(rnd(rng, d), dtype=torch.float32, device="cuda") if fuse else None
            xgs = [torch.zeros(n, dtype=torch.bfloat16, device="cuda") for _ in range(ranks)]
            sumsq = [torch.zeros(8 + 8 * 4096, dtype=torch.float32, device="cuda") for _ in range(ranks)]
            torch.cuda.synchronize()
            for r in range(ranks):
                args = [ptr(xs[r]), i32(d), ptr(ex_t), ptr(fl_t), ptr(epochs[r]), i32(r), i32(ranks), ctypes.c_longlong(half), ptr(g), ptr(xgs[r]), ptr(sumsq[r] if fuse else None)]
                launch_on(f, (per_row, rows), 256, args, streams[r].cuda_stream)
            torch.cuda.synchronize()
            got = [x.cpu().numpy() for x in xs]
            worst = max(worst, float(np.abs(got[0] - want).max()))
            same = same and all(np.array_equal(got[0], o) for o in got[1:])
            if fuse:
                # The next norm's input as the accumulating GEMVs leave it: x ⊙ g in bf16, and per
                # row the block partials of the sum of squares (their count in the header word).
                rows_x = want.astype(np.float64).reshape(rows, d)
                xg_err = rel(host(xgs[0]).reshape(rows, d), rows_x * host(g))
                head = sumsq[0][:8].cpu().numpy().view(np.uint32)
                partials = sumsq[0][8:].cpu().numpy().reshape(8, 4096)[:rows, :per_row].astype(np.float64).sum(axis=1)
                ss_err = rel(partials, (rows_x ** 2).sum(axis=1)) + float(head[0] != per_row)
                report(f"all_reduce_oneshot_f32 next-norm input ({ranks} ranks, {rows}x{d})", max(xg_err, ss_err), 8e-3)
        report(f"all_reduce_oneshot_f32 ({ranks} ranks, 6 calls)", worst if same else 1.0, 1e-30)


SAMPLE_PARAMS = np.dtype(
    [("temperature", "<f4"), ("top_p", "<f4"), ("min_p", "<f4"), ("repetition_penalty", "<f4"),
     ("frequency_penalty", "<f4"), ("presence_penalty", "<f4"), ("top_k", "<i4"), ("seen_start", "<i4"),
     ("seen_count", "<i4"), ("logprobs", "<i4"), ("random", "<u8")], align=True)
assert SAMPLE_PARAMS.itemsize == 48


def sample_params(rows, **fields):
    p = np.zeros(rows, SAMPLE_PARAMS)
    p["temperature"], p["top_p"], p["repetition_penalty"], p["logprobs"] = 1.0, 1.0, 1.0, -1
    for k, v in fields.items():
        p[k] = v
    return torch.from_numpy(p.view(np.uint8).copy()).cuda()


LOGPROB_WORDS = 42  # RowLogprobs in sampling.cu: chosen, count, ids[20], values[20]


def read_logprobs(lp):
    """Each row's (chosen, [(id, logprob)...]) from RowLogprobs words."""
    w = lp.cpu().numpy()
    out = []
    for row in w:
        count = int(row[1])
        vals = row[22:42].view(np.float32)
        out.append((float(row[:1].view(np.float32)[0]), [(int(row[2 + k]), float(vals[k])) for k in range(count)]))
    return out


def logprobs_ref(raw, picked, n):
    """float64 reference: the raw rows' log-softmax at the picks and the n
    largest (ties: lower id first)."""
    out = []
    for row, pick in zip(raw.astype(np.float64), picked):
        ls = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        order = np.lexsort((np.arange(len(row)), -row))[:n]
        out.append((float(ls[pick]), [(int(i), float(ls[i])) for i in order]))
    return out


def check_logprobs(name, want, got):
    ids_ok = all([i for i, _ in g[1]] == [i for i, _ in w[1]] for w, g in zip(want, got))
    err = max([abs(g[0] - w[0]) for w, g in zip(want, got)]
              + [abs(gv - wv) for w, g in zip(want, got) for (_, gv), (_, wv) in zip(g[1], w[1])])
    report(f"sample_rows logprobs {name}: ids (exact)", 0.0 if ids_ok else 1.0, 0.5)
    report(f"sample_rows logprobs {name}: values (abs err)", err, 1e-4)


def survivors(l, T, k, p, min_p):
    """The host sampler's truncation (float64): ids most likely first and
    their renormalised probabilities."""
    order = np.argsort(-l, kind="stable")
    if k > 0:
        order = order[:k]
    probs = np.exp((l[order] - l[order[0]]) / T)
    z = probs.sum()
    keep = len(probs)
    if min_p > 0:
        keep = max(1, int(np.sum(probs >= min_p)))
    if p < 1:
        cum = np.cumsum(probs[:keep] / z)
        keep = min(keep, int(np.searchsorted(cum, p)) + 1)
    return order, probs[:keep] / probs[:keep].sum()


def check_sampling(m, rng):
    # argmax_rows (ties: lowest index)
    S, V = 9, 151936
    logits = rnd(rng, S, V).astype(np.float32)
    logits[3, 100] = logits[3, 200] = 5.0
    ids = torch.empty(S, dtype=torch.int32, device="cuda")
    launch(m.fn("argmax_rows"), (S,), 1024, [ptr(dev(logits, torch.float32)), i32(V), ptr(ids)])
    got, want = ids.cpu().numpy(), logits.argmax(-1)
    report("argmax_rows (exact, ties to lowest id)", float(np.mean(got != want)), 1e-9)

    # sample_rows, greedy with penalties: logits rewritten in place, then argmax.
    S = 16
    logits = rnd(rng, S, V, scale=4.0).astype(np.float32)
    seen, params = [], np.zeros(S, SAMPLE_PARAMS)
    want_l = logits.astype(np.float64).copy()
    for r in range(S):
        toks = rng.choice(V, size=int(rng.integers(1, 400)), replace=False)
        counts = rng.integers(0, 4, size=len(toks))
        params[r] = (0.0, 1.0, 0.0, 1.3, 0.4, 0.25, 0, len(seen), len(toks), 5, 0)
        for t, c in zip(toks, counts):
            seen.append((t, c))
            x = want_l[r, t]
            x = x / 1.3 if x > 0 else x * 1.3
            want_l[r, t] = x - (0.4 * c + 0.25 if c > 0 else 0.0)
    ld = dev(logits, torch.float32)
    seen_d = torch.tensor(np.array(seen, np.int32)).cuda()
    ids = torch.empty(S, dtype=torch.int32, device="cuda")
    pd = torch.from_numpy(params.view(np.uint8).copy()).cuda()
    seen_raw = torch.empty(len(seen), dtype=torch.float32, device="cuda")
    lp = torch.zeros(S, LOGPROB_WORDS, dtype=torch.int32, device="cuda")
    launch(m.fn("sample_rows"), (S,), 512, [ptr(ld), i32(V), ptr(pd), ptr(seen_d), ptr(ids), ptr(seen_raw), ptr(lp)])
    report("sample_rows penalties (logits in place)", rel(host(ld), want_l), 1e-6)
    report("sample_rows greedy after penalties (exact)",
           float(np.mean(ids.cpu().numpy() != want_l.argmax(-1))), 1e-9)
    check_logprobs("greedy after penalties, top 5", logprobs_ref(logits, ids.cpu().numpy(), 5), read_logprobs(lp))

    # Logprobs of sampled rows, ties at the top-n boundary (lowest ids
    # first), n = 0 and n = 20.
    V = 1000
    rows = rnd(rng, 4, V, scale=2.0).astype(np.float32)
    rows[0, 10], rows[0, [3, 500, 700, 999]] = 9.0, 8.0  # top 3: 10, 3, 500
    rows[1, [4, 40, 400]] = 7.0  # top 2: 4, 40
    want_n = [3, 2, 0, 20]
    pd = sample_params(4, temperature=0.8, random=rng.integers(0, 2**63, size=4, dtype=np.uint64),
                       logprobs=np.array(want_n, np.int32))
    ids = torch.empty(4, dtype=torch.int32, device="cuda")
    lp = torch.zeros(4, LOGPROB_WORDS, dtype=torch.int32, device="cuda")
    launch(m.fn("sample_rows"), (4,), 512, [ptr(dev(rows, torch.float32)), i32(V), ptr(pd), ptr(seen_d), ptr(ids),
                                            ptr(seen_raw), ptr(lp)])
    got = read_logprobs(lp)
    want = [logprobs_ref(rows[r:r + 1], ids.cpu().numpy()[r:r + 1], n)[0] for r, n in enumerate(want_n)]
    check_logprobs("sampled rows, ties at the boundary, n = 3/2/0/20", want, got)

    # sample_rows draws: many rows of one logits row, each its own random
    # bits; every draw must be a survivor (allowing the boundary token, where
    # f32 and f64 sums may disagree) and the draws must follow the
    # renormalised survivors as closely as NumPy's own multinomial does.
    R = 8192
    cases = [dict(temperature=0.7, top_k=50), dict(top_p=0.9), dict(temperature=1.3, min_p=0.05),
             dict(temperature=0.8, top_k=300, top_p=0.8, min_p=0.002), dict(temperature=0.6)]
    for n, case in enumerate(cases):
        # Odd vocabularies take the scalar path, multiples of 4 the float4 one.
        V = 32003 if n % 2 else 32000
        row = rnd(rng, V, scale=9.0).astype(np.float32)
        T = case.get("temperature", 1.0)
        order, probs = survivors(row.astype(np.float64), T, case.get("top_k", 0), case.get("top_p", 1.0),
                                 case.get("min_p", 0.0))
        K = len(probs)
        ld = dev(np.tile(row, (R, 1)), torch.float32)
        randoms = rng.integers(0, 2**63, size=R, dtype=np.uint64)
        pd = sample_params(R, random=randoms, **case)
        ids = torch.empty(R, dtype=torch.int32, device="cuda")
        launch(m.fn("sample_rows"), (R,), 512, [ptr(ld), i32(V), ptr(pd), ptr(seen_d), ptr(ids), ptr(None), ptr(None)])
        got = ids.cpu().numpy()
        rank = {int(t): i for i, t in enumerate(order[:K + 1])}
        outside = float(np.mean([int(t) not in rank for t in got]))
        hist = np.bincount([min(rank.get(int(t), K), K - 1) for t in got], minlength=K)[:K] / R
        tv = 0.5 * np.abs(hist - probs).sum()
        ref = np.mean([0.5 * np.abs(rng.multinomial(R, probs) / R - probs).sum() for _ in range(20)])
        report(f"sample_rows V={V} {case} draws outside the survivors", outside, 1e-9)
        report(f"sample_rows V={V} {case} total variation / (1.5 x NumPy's)", tv / (1.5 * ref + 1e-3), 1.0)

    # Time at a serving shape: 256 rows of a 128k vocabulary.
    R, V = 256, 128256
    big = rnd(rng, R, V, scale=9.0).astype(np.float32)
    lp_big = torch.zeros(R, LOGPROB_WORDS, dtype=torch.int32, device="cuda")
    for case in [dict(temperature=0.7), dict(temperature=0.7, top_k=50), dict(top_p=0.9),
                 dict(temperature=0.7, top_k=50, top_p=0.95, min_p=0.05), dict(temperature=0.7, logprobs=20)]:
        best = float("inf")
        for _ in range(3):
            ld = dev(big, torch.float32)
            pd = sample_params(R, random=rng.integers(0, 2**63, size=R, dtype=np.uint64), **case)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(m.fn("sample_rows"), (R,), 512, [ptr(ld), i32(V), ptr(pd), ptr(seen_d), ptr(ids), ptr(seen_raw), ptr(lp_big)])
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end))
        print(f"time sample_rows {R} x {V} {case}: {best * 1e3:.0f} us")


def check_logit_bias(m, rng):
    # apply_logit_bias: a sparse add of (row, token, bias) entries, exact.
    S, V = 6, 151936
    logits = rnd(rng, S, V, scale=4.0).astype(np.float32)
    want = logits.copy()
    entries = []
    for r in range(S):
        for t in rng.choice(V, size=int(rng.integers(0, 300)), replace=False):
            b = np.float32(rng.uniform(-100, 100))
            entries.append((r, int(t), b))
            want[r, t] += b
    words = np.array([(r, t, np.float32(b).view(np.uint32)) for r, t, b in entries], np.uint32)
    ld = dev(logits, torch.float32)
    ed = torch.from_numpy(words.view(np.int32).reshape(-1).copy()).cuda()
    n = len(entries)
    launch(m.fn("apply_logit_bias"), ((n + 255) // 256,), 256, [ptr(ld), i32(V), ptr(ed), i32(n)])
    report("apply_logit_bias (exact)", float(np.max(np.abs(host(ld) - want))), 1e-9)

    # Issue 36's acceptance on the device: 1,000 sampled rows of one logits
    # row of Qwen3's vocabulary at temperature 1; -100 on its most likely
    # token keeps it out of every draw, +100 on an unlikely one forces it in
    # every draw. (1,000 rows of 151,936 tokens: a draw whose uniform
    # rounded to 1.0, once in 2^24 tokens, made ~9 of them pick at random.)
    R, V = 1000, 151936
    row = rnd(rng, V, scale=3.0).astype(np.float32)
    top, rare = int(row.argmax()), int(row.argmin())
    row[top] = row.max() + 8.0  # ~all of the mass without the bias
    for token, bias, name in ((top, -100.0, "banned"), (rare, 100.0, "forced")):
        ld = dev(np.tile(row, (R, 1)), torch.float32)
        words = np.array([(r, token, np.float32(bias).view(np.uint32)) for r in range(R)], np.uint32)
        ed = torch.from_numpy(words.view(np.int32).reshape(-1).copy()).cuda()
        launch(m.fn("apply_logit_bias"), ((R + 255) // 256,), 256, [ptr(ld), i32(V), ptr(ed), i32(R)])
        pd = sample_params(R, random=rng.integers(0, 2**63, size=R, dtype=np.uint64))
        ids = torch.empty(R, dtype=torch.int32, device="cuda")
        seen_d = torch.zeros(2, dtype=torch.int32, device="cuda")
        launch(m.fn("sample_rows"), (R,), 512, [ptr(ld), i32(V), ptr(pd), ptr(seen_d), ptr(ids), ptr(None), ptr(None)])
        got = ids.cpu().numpy()
        wrong = np.mean(got == token) if bias < 0 else np.mean(got != token)
        report(f"logit_bias {bias:+.0f} {name} token {token} in {R} sampled rows (share wrong)", float(wrong), 1e-9)


# KV cache element types: (kernel name infix, torch dtype, tolerance of a
# value written into the cache). FP8 e4m3 keeps 3 mantissa bits: a written
# value is within 2^-4 of its own magnitude (kv_types.cuh).
KV_TYPES = (("", torch.bfloat16, 8e-3), ("_fp8", torch.float8_e4m3fn, 7e-2))


def kv_round(x, dtype):
    """Rounds through the cache's element type (what attention reads)."""
    return torch.tensor(x, dtype=torch.float64).to(dtype).double().numpy()


def to_device_layout(a, KVH, hd, bs):
    """[slots, KVH * hd] (slot = block * bs + offset) -> the cache's [blocks, KVH, bs, hd]."""
    return a.reshape(-1, bs, KVH, hd).transpose(0, 2, 1, 3).reshape(a.shape[0], KVH * hd)


def from_device_layout(a, KVH, hd, bs):
    return a.reshape(-1, KVH, bs, hd).transpose(0, 2, 1, 3).reshape(a.shape[0], KVH * hd)


def rotate(a, cos, sin, pos):
    """Rotate-half RoPE of a [tokens, heads, hd] array at the tokens' positions."""
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    half = a.shape[-1] // 2
    a1, a2 = a[..., :half], a[..., half:]
    return np.concatenate([a1 * c - a2 * s, a2 * c + a1 * s], -1)


def rope_tables(hd, max_pos, theta):
    inv = 1.0 / theta ** (np.arange(0, hd // 2) * 2.0 / hd)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def check_rope(m, rng):
    for (H, KVH, hd, bias, qk_norm), (infix, kv_dtype, kv_tol) in itertools.product(
            ((9, 3, 64, False, False), (16, 8, 128, False, True), (28, 4, 128, True, False), (4, 1, 256, False, True)),
            KV_TYPES):
        T, max_pos, nslots = 19, 4096, 512
        w = (H + 2 * KVH) * hd
        qkv = bf(rnd(rng, T, w, scale=2.0))
        b = rnd(rng, w, scale=0.5).astype(np.float32).astype(np.float64) if bias else None
        qn = (1 + 0.3 * rnd(rng, hd)).astype(np.float32).astype(np.float64) if qk_norm else None
        kn = (1 + 0.3 * rnd(rng, hd)).astype(np.float32).astype(np.float64) if qk_norm else None
        pos = rng.integers(0, max_pos, T)
        slots = rng.permutation(nslots)[:T]
        cos, sin = rope_tables(hd, max_pos, 10000.0)
        cos, sin = cos.astype(np.float32).astype(np.float64), sin.astype(np.float32).astype(np.float64)
        q_out = torch.empty(T, H * hd, dtype=torch.bfloat16, device="cuda")
        kc = torch.zeros(nslots, KVH * hd, dtype=kv_dtype, device="cuda")
        vc = torch.zeros(nslots, KVH * hd, dtype=kv_dtype, device="cuda")
        args = [ptr(dev(qkv, torch.bfloat16)), ptr(dev(b, torch.float32) if bias else None),
                ptr(dev(qn, torch.float32) if qk_norm else None), ptr(dev(kn, torch.float32) if qk_norm else None),
                ptr(dev(pos, torch.int32)), ptr(dev(slots, torch.int64)),
                ptr(dev(cos, torch.float32)), ptr(dev(sin, torch.float32)),
                ptr(q_out), ptr(kc), ptr(vc), i32(H), i32(KVH), i32(hd), f32(1e-6), i32(16)]
        launch(m.fn(f"rope_qkv{infix}"), (T, (H + 2 * KVH + 7) // 8), 256, args)  # a warp per head, 8 per block
        x = qkv + (b if bias else 0)
        q = x[:, :H * hd].reshape(T, H, hd)
        k = x[:, H * hd:(H + KVH) * hd].reshape(T, KVH, hd)
        v = x[:, (H + KVH) * hd:].reshape(T, KVH, hd)
        if qk_norm:
            q = q / np.sqrt((q ** 2).mean(-1, keepdims=True) + 1e-6) * qn
            k = k / np.sqrt((k ** 2).mean(-1, keepdims=True) + 1e-6) * kn

        def rot(a):
            return rotate(a, cos, sin, pos)

        tag = f"H={H} KVH={KVH} hd={hd}{' bias' if bias else ''}{' qk_norm' if qk_norm else ''}"
        report(f"rope_qkv{infix} q {tag}", rel(host(q_out).reshape(T, H, hd), rot(q)), 8e-3)
        kh = from_device_layout(host(kc), KVH, hd, 16)
        vh = from_device_layout(host(vc), KVH, hd, 16)
        report(f"rope_qkv{infix} k -> cache slot {tag}", rel(kh[slots].reshape(T, KVH, hd), rot(k)), kv_tol)
        report(f"rope_qkv{infix} v -> cache slot {tag}", rel(vh[slots].reshape(T, KVH, hd), v), kv_tol)


def paged_setup(rng, lens, KVH, hd, bs):
    """Random K/V in a shuffled block pool; returns tables padded to one stride."""
    nblocks = sum(math.ceil(n / bs) for n in lens) + 3
    perm = rng.permutation(nblocks)
    tables, at = [], 0
    for n in lens:
        nb = math.ceil(n / bs)
        tables.append(list(perm[at:at + nb]))
        at += nb
    stride = max(len(t) for t in tables)
    table = np.zeros((len(lens), stride), np.int64)
    for i, t in enumerate(tables):
        table[i, :len(t)] = t
    k = bf(rnd(rng, nblocks * bs, KVH * hd, scale=1.5))
    v = bf(rnd(rng, nblocks * bs, KVH * hd))
    return table, stride, k, v


def reference_attention(q, k, v, table, seq, pos, H, KVH, hd, bs, window=0):
    """q: [H, hd] of one token at position pos of sequence seq (the last
    `window` positions only, when set)."""
    keys = np.arange(max(0, pos + 1 - window) if window else 0, pos + 1)
    slots = table[seq][keys // bs] * bs + keys % bs
    kk = k[slots].reshape(-1, KVH, hd)
    vv = v[slots].reshape(-1, KVH, hd)
    g = H // KVH
    out = np.zeros((H, hd))
    for h in range(H):
        s = kk[:, h // g, :] @ q[h] / math.sqrt(hd)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ vv[:, h // g, :]
    return out


def check_attention(m, rng):
    bs = 16
    # (H, KVH, hd, sliding window): Llama shapes with full attention, then
    # windowed ones (Gemma 3: 270M is 4 x 1 x 256, window 512).
    for (H, KVH, hd, window), (infix, kv_dtype, _) in itertools.product(
            ((9, 3, 64, 0), (32, 8, 128, 0), (64, 8, 128, 0), (8, 8, 128, 0), (9, 3, 64, 100), (4, 1, 256, 0),
             (4, 1, 256, 300)), KV_TYPES):
        g = H // KVH
        scale_log2 = math.log2(math.e) / math.sqrt(hd)
        # Decode: one token per sequence at the end of contexts of various lengths.
        lens = [1, 17, 300, 1000, 64]
        table, stride, k, v = paged_setup(rng, lens, KVH, hd, bs)
        k, v = kv_round(k, kv_dtype), kv_round(v, kv_dtype)
        n = len(lens)
        q = bf(rnd(rng, n, H * hd))
        pos = np.array(lens) - 1
        want = np.stack([reference_attention(q[i].reshape(H, hd), k, v, table, i, pos[i], H, KVH, hd, bs, window)
                         for i in range(n)])
        prefetch = torch.ones(3 << 19, dtype=torch.bfloat16, device="cuda")
        for splits in (1, 4):
            out = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
            part_acc = torch.zeros(n * H * splits * hd, dtype=torch.float32, device="cuda")
            part_ml = torch.zeros(n * H * splits * 2, dtype=torch.float32, device="cuda")
            tabled = dev(table.reshape(-1), torch.int32)
            strided = dev([stride], torch.int32)
            seq = dev(np.arange(n), torch.int32)
            posd = dev(pos, torch.int32)
            kd, vd = (dev(to_device_layout(a, KVH, hd, bs), kv_dtype) for a in (k, v))
            args = [ptr(dev(q, torch.bfloat16)), ptr(kd), ptr(vd), ptr(tabled),
                    ptr(strided), ptr(seq), ptr(posd), ptr(None), ptr(out), ptr(part_acc), ptr(part_ml),
                    i32(H), i32(KVH), i32(bs), f32(scale_log2), i32(splits),
                    # L2 prefetch of some other buffer (a hint: must not change the result):
                    # early without a hint with one split, late with evict-last with four.
                    ptr(prefetch), ctypes.c_uint64(prefetch.numel() * 2), i32(1 if splits == 1 else 2), i32(window)]
            # The SIMT kernel, and the tensor-core one (head sizes 64 and 128)
            # with the same arguments and partials; its dynamic shared memory
            # is DecodeTcSmem::BYTES (4 warps; bf16: 3 stages of K/V tiles with
            # rows padded by 8 elements; FP8: 4 raw stages, rows padded by 16 bytes).
            tc_smem = 4 * (4 * 2 * 16 * (hd + 16) if infix else 3 * 2 * 16 * (hd + 8) * 2)
            variants = [("", 0)] + ([("_tc", tc_smem)] if hd <= 128 else [])
            for tc, smem in variants:
                out.zero_()
                launch(m.fn(f"paged_attention{tc}{infix}_hd{hd}_g{g}"), (n, KVH, splits), 128, args, smem=smem)
                if splits > 1:
                    launch(m.fn("attention_combine"), (n, H), 128,
                           [ptr(part_acc), ptr(part_ml), ptr(None), ptr(out), i32(H), i32(hd), i32(splits)])
                report(f"paged_attention{tc}{infix} hd={hd} g={g} splits={splits} window={window} ctx={lens}",
                       rel(host(out).reshape(n, H, hd), want), 2e-2)
        # Rows of one sequence (a verification step: 5 tokens at the end of a 300-key context)
        # beside a lone row: each row attends to the keys up to its own position only.
        lens = [300, 40]
        table, stride, k, v = paged_setup(rng, lens, KVH, hd, bs)
        k, v = kv_round(k, kv_dtype), kv_round(v, kv_dtype)
        pos, seqs = np.array([295, 296, 297, 298, 299, 39]), np.array([0, 0, 0, 0, 0, 1])
        n = len(pos)
        q = bf(rnd(rng, n, H * hd))
        want = np.stack([reference_attention(q[i].reshape(H, hd), k, v, table, seqs[i], pos[i], H, KVH, hd, bs, window)
                         for i in range(n)])
        kd, vd = (dev(to_device_layout(a, KVH, hd, bs), kv_dtype) for a in (k, v))
        for splits in (1, 4):
            out = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
            part_acc = torch.zeros(n * H * splits * hd, dtype=torch.float32, device="cuda")
            part_ml = torch.zeros(n * H * splits * 2, dtype=torch.float32, device="cuda")
            launch(m.fn(f"paged_attention{infix}_hd{hd}_g{g}"), (n, KVH, splits), 128,
                   [ptr(dev(q, torch.bfloat16)), ptr(kd), ptr(vd), ptr(dev(table.reshape(-1), torch.int32)),
                    ptr(dev([stride], torch.int32)), ptr(dev(seqs, torch.int32)), ptr(dev(pos, torch.int32)),
                    ptr(None), ptr(out), ptr(part_acc), ptr(part_ml), i32(H), i32(KVH), i32(bs), f32(scale_log2),
                    i32(splits), ptr(None), ctypes.c_uint64(0), i32(0), i32(window)])
            if splits > 1:
                launch(m.fn("attention_combine"), (n, H), 128,
                       [ptr(part_acc), ptr(part_ml), ptr(None), ptr(out), i32(H), i32(hd), i32(splits)])
            report(f"paged_attention{infix} hd={hd} g={g} splits={splits} window={window}: 5 rows of one sequence",
                   rel(host(out).reshape(n, H, hd), want), 2e-2)
        if hd > 128:
            continue  # no tensor-core prefill kernel: prefill rows take the decode kernel

        # Prefill: a 150-token chunk after a 70-token cached prefix, plus a short chunk.
        prefix, chunk = 70, 150
        lens = [prefix + chunk, 20]
        table, stride, k, v = paged_setup(rng, lens, KVH, hd, bs)
        k, v = kv_round(k, kv_dtype), kv_round(v, kv_dtype)
        T = chunk + 20
        q = bf(rnd(rng, T, H * hd))
        pos = np.concatenate([prefix + np.arange(chunk), np.arange(20)])
        seqs = np.concatenate([np.zeros(chunk, int), np.ones(20, int)])
        tiles, tt = [], 128 // g  # a tile is 128 / G tokens x the G heads of a kv head
        for start in range(0, chunk, tt):
            tiles += [start, min(tt, chunk - start), 0]
        for start in range(0, 20, tt):
            tiles += [chunk + start, min(tt, 20 - start), 1]
        out = torch.zeros(T, H * hd, dtype=torch.bfloat16, device="cuda")
        # PrefillSmem: Q (128 rows), K and V (64 rows), + a raw FP8 K/V tile.
        smem = (128 + 2 * 64) * (hd + 8) * 2 + (64 * hd if infix else 0)
        kd, vd = (dev(to_device_layout(a, KVH, hd, bs), kv_dtype) for a in (k, v))
        args = [ptr(dev(q, torch.bfloat16)), ptr(kd), ptr(vd),
                ptr(dev(table.reshape(-1), torch.int32)), ptr(dev([stride], torch.int32)), ptr(dev(tiles, torch.int32)),
                ptr(dev(pos, torch.int32)), ptr(out), i32(H), i32(KVH), i32(bs), f32(scale_log2), i32(window)]
        launch(m.fn(f"prefill_attention{infix}_hd{hd}"), (len(tiles) // 3, KVH), 256, args, smem=smem)
        want = np.stack([reference_attention(q[t].reshape(H, hd), k, v, table, seqs[t], pos[t], H, KVH, hd, bs, window)
                         for t in range(T)])
        report(f"prefill_attention{infix} hd={hd} H={H} KVH={KVH} window={window} (cached prefix {prefix})",
               rel(host(out).reshape(T, H, hd), want), 2e-2)


SUMSQ_BYTES = 4 * (8 + 8 * 4096)  # SumSq in common.cuh: block count (+7 pad), partials[8][4096]


def sumsq_buffer(ss=None):
    """A SumSq, optionally holding each row's sum of squares as one partial."""
    buf = torch.zeros(SUMSQ_BYTES // 4, dtype=torch.float32, device="cuda")
    if ss is not None:
        buf.view(torch.int32)[0] = 1
        for n, v in enumerate(np.asarray(ss)):
            buf[8 + n * 4096] = float(v)
    return buf


def sumsq_rows(buf, rows):
    """Each row's total over the writer's block partials, and the block count."""
    blocks = int(buf.view(torch.int32)[0].item())
    parts = host(buf)[8:].reshape(8, 4096)
    return parts[:rows, :blocks].sum(-1), blocks


def check_gemv(m, rng):
    # The general kernels and, on rows of at most 2,048 inputs, the short
    # ones (whole rows loaded before the PDL wait, x staged in shared memory).
    for pre, n, inp, out in (("gemv", 1, 576, 960), ("gemv", 3, 1536, 576), ("gemv", 8, 4096, 1000),
                             ("gemv_short", 1, 576, 960), ("gemv_short", 5, 1536, 576),
                             ("gemv_short", 8, 2048, 1000), ("gemv_short", 7, 576, 3000)):
        x = bf(rnd(rng, n, inp))
        w = bf(rnd(rng, out, inp, scale=0.05))
        want = x @ w.T
        xd, wd = dev(x, torch.bfloat16), dev(w, torch.bfloat16)
        grid = (math.ceil(out / 8),)
        y = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{pre}_n{n}_bf16"), grid, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(None), ptr(None), ptr(None)])
        report(f"{pre} n={n} {inp}->{out} bf16 out", rel(host(y), want), 8e-3)
        y = torch.empty(n, out, dtype=torch.float32, device="cuda")
        launch(m.fn(f"{pre}_n{n}_f32"), grid, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(None), ptr(None), ptr(None)])
        report(f"{pre} n={n} {inp}->{out} f32 out", rel(host(y), want), 1e-5)
        base = rnd(rng, n, out).astype(np.float32).astype(np.float64)
        y = dev(base, torch.float32)
        ssb = sumsq_buffer()
        y = dev(base, torch.float32)
        g = (1 + 0.2 * rnd(rng, out)).astype(np.float32).astype(np.float64)
        xg = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{pre}_n{n}_add_f32"), grid, 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(ssb),
                                                     ptr(dev(g, torch.float32)), ptr(xg)])
        report(f"{pre} n={n} {inp}->{out} f32 accumulate", rel(host(y), base + want), 1e-5)
        report(f"{pre} n={n} {inp}->{out} f32 accumulate: pre-scaled bf16 copy", rel(host(xg), (base + want) * g), 4e-3)
        got, blocks = sumsq_rows(ssb, n)
        report(f"{pre} n={n} {inp}->{out} f32 accumulate: sums of squares", rel(got, ((base + want) ** 2).sum(-1)), 1e-5)
        report(f"{pre} n={n} {inp}->{out} f32 accumulate: one partial per block", abs(blocks - grid[0]), 0.5)
        # SwiGLU: w2 stacks gate rows then up rows; y = silu(x·gate) * (x·up).
        w2 = bf(rnd(rng, 2 * out, inp, scale=0.05))
        gate, up = x @ w2[:out].T, x @ w2[out:].T
        y = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"{pre}_n{n}_swiglu"), grid, 256, [ptr(xd), ptr(dev(w2, torch.bfloat16)), ptr(y), i32(inp), i32(out)])
        report(f"{pre} n={n} {inp}->{out} swiglu (bf16 out)", rel(host(y), gate / (1 + np.exp(-gate)) * up), 8e-3)
        launch(m.fn(f"{pre}_n{n}_geglu"), grid, 256, [ptr(xd), ptr(dev(w2, torch.bfloat16)), ptr(y), i32(inp), i32(out)])
        report(f"{pre} n={n} {inp}->{out} geglu (bf16 out)", rel(host(y), gelu_tanh(gate) * up), 8e-3)


def check_gemv_whole4k(m, rng):
    """Batch 1's whole-row f32 accumulate (rows of 2,049 to 4,096 inputs loaded whole before the wait,
    x in shared memory) against float64 and bit for bit against the plain kernel (same order of sums):
    the MoE o_proj's shape, a row shorter than a lane's 16 loads, and rows past the last warp."""
    for inp, out in ((4096, 2048), (2056, 300), (3000, 1001)):
        x = bf(rnd(rng, 1, inp))
        w = bf(rnd(rng, out, inp, scale=0.05))
        want = x @ w.T
        xd, wd = dev(x, torch.bfloat16), dev(w, torch.bfloat16)
        base = rnd(rng, 1, out).astype(np.float32).astype(np.float64)
        g = (1 + 0.2 * rnd(rng, out)).astype(np.float32).astype(np.float64)
        ys = []
        for name in ("gemv_whole4k_n1_add_f32", "gemv_n1_add_f32"):
            y, ssb = dev(base, torch.float32), sumsq_buffer()
            xg = torch.empty(1, out, dtype=torch.bfloat16, device="cuda")
            launch(m.fn(name), (math.ceil(out / 8),), 256, [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out), ptr(ssb),
                                                            ptr(dev(g, torch.float32)), ptr(xg)])
            ys.append((host(y), host(xg), sumsq_rows(ssb, 1)[0]))
        (y, xg, sq), (y0, xg0, sq0) = ys
        tag = f"gemv_whole4k {inp}->{out}"
        report(f"{tag} f32 accumulate", rel(y, base + want), 1e-5)
        report(f"{tag} pre-scaled bf16 copy", rel(xg, (base + want) * g), 4e-3)
        report(f"{tag} sums of squares", rel(sq, ((base + want) ** 2).sum(-1)), 1e-5)
        report(f"{tag} bit for bit the plain kernel (y, xg, sums of squares)",
               float(np.abs(y - y0).max() + np.abs(xg - xg0).max() + np.abs(sq - sq0).max()), 1e-30)


def check_gemv_tc(m, rng):
    """The tensor-core GEMVs of 2-8 rows (cuda.tc_gemv_min_rows): bf16 and f32 out and f32 accumulate against
    float64, on 8B-like widths; blocks of 16 outputs, chunks of 32 inputs split over 8 warps (a width
    of 96 chunks leaves some warps fewer than others), and SmolLM2's LM head width (576: 18 chunks,
    fewer than the warps' first round of loads)."""
    for n, inp, out in ((2, 4096, 1024), (4, 14336, 512), (5, 3104, 4096), (8, 4096, 1008), (6, 576, 4096)):
        x = bf(rnd(rng, n, inp))
        w = bf(rnd(rng, out, inp, scale=0.05))
        want = x @ w.T
        xd, wd = dev(x, torch.bfloat16), dev(w, torch.bfloat16)
        args = lambda y: [ptr(xd), ptr(wd), ptr(y), i32(inp), i32(out)]
        y = torch.empty(n, out, dtype=torch.bfloat16, device="cuda")
        launch(m.fn(f"gemv_tc_n{n}_bf16"), (out // 16,), 256, args(y))
        report(f"gemv_tc n={n} {inp}->{out} bf16 out", rel(host(y), want), 8e-3)
        y = torch.empty(n, out, dtype=torch.float32, device="cuda")
        launch(m.fn(f"gemv_tc_n{n}_f32"), (out // 16,), 256, args(y))
        report(f"gemv_tc n={n} {inp}->{out} f32 out", rel(host(y), want), 1e-5)
        base = rnd(rng, n, out).astype(np.float32).astype(np.float64)
        y = dev(base, torch.float32)
        launch(m.fn(f"gemv_tc_n{n}_add_f32"), (out // 16,), 256, args(y))
        report(f"gemv_tc n={n} {inp}->{out} f32 accumulate", rel(host(y), base + want), 1e-5)


def check_fused_norm(m, rng):
    """SwiGLU and q/k/v+rope GEMVs that apply the input RMSNorm themselves,
    from the pre-scaled input xg = bf16(x * g) and the sums of squares of x
    (each row's scale summed by a warp of its own)."""
    for pre, n in (("gemv", 2), ("gemv", 8), ("gemv_short", 1), ("gemv_short", 5), ("gemv_short", 8)):
        check_fused_norm_rows(m, rng, pre, n)


def check_fused_norm_rows(m, rng, pre, n):
    d, ff, eps = 576, 1536, 1e-5
    x = rnd(rng, n, d, scale=3.0).astype(np.float32).astype(np.float64)
    nw = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    xg = bf(x * nw)
    xn = xg / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    ssb = sumsq_buffer((x ** 2).sum(-1))
    w2 = bf(rnd(rng, 2 * ff, d, scale=0.05))
    gate, up = xn @ w2[:ff].T, xn @ w2[ff:].T
    y = torch.empty(n, ff, dtype=torch.bfloat16, device="cuda")
    launch(m.fn(f"{pre}_n{n}_swiglu_norm"), (math.ceil(ff / 8),), 256,
           [ptr(dev(xg, torch.bfloat16)), f32(eps), ptr(ssb), ptr(dev(w2, torch.bfloat16)), ptr(y), i32(d), i32(ff)])
    report(f"{pre} n={n} swiglu with fused RMSNorm", rel(host(y), gate / (1 + np.exp(-gate)) * up), 8e-3)
    launch(m.fn(f"{pre}_n{n}_geglu_norm"), (math.ceil(ff / 8),), 256,
           [ptr(dev(xg, torch.bfloat16)), f32(eps), ptr(ssb), ptr(dev(w2, torch.bfloat16)), ptr(y), i32(d), i32(ff)])
    report(f"{pre} n={n} geglu with fused RMSNorm", rel(host(y), gelu_tanh(gate) * up), 8e-3)
    wp = bf(rnd(rng, 704, d, scale=0.05))  # q/k/v of a q/k-norm model: plain bf16 out
    yp = torch.empty(n, 704, dtype=torch.bfloat16, device="cuda")
    launch(m.fn(f"{pre}_n{n}_bf16_norm"), (704 // 8,), 256,
           [ptr(dev(xg, torch.bfloat16)), f32(eps), ptr(ssb), ptr(dev(wp, torch.bfloat16)), ptr(yp), i32(d), i32(704)])
    report(f"{pre} n={n} bf16 out with fused RMSNorm", rel(host(yp), xn @ wp.T), 8e-3)
    H, KVH, hd = 9, 3, 64
    w = (H + 2 * KVH) * hd
    wq = bf(rnd(rng, w, d, scale=0.05))
    yq = xn @ wq.T
    pos, slots = rng.integers(0, 512, n), rng.permutation(64)[:n]
    cos, sin = (a.astype(np.float32).astype(np.float64) for a in rope_tables(hd, 512, 10000.0))
    q_out = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
    kc = torch.zeros(64, KVH * hd, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros(64, KVH * hd, dtype=torch.bfloat16, device="cuda")
    launch(m.fn(f"{pre}_n{n}_qkv_rope_norm"), (math.ceil(w / 8),), 256,
           [ptr(dev(xg, torch.bfloat16)), f32(eps), ptr(ssb), ptr(dev(wq, torch.bfloat16)), i32(d), ptr(None),
            ptr(dev(pos, torch.int32)), ptr(dev(slots, torch.int64)), ptr(dev(cos, torch.float32)), ptr(dev(sin, torch.float32)),
            ptr(q_out), ptr(kc), ptr(vc), i32(H), i32(KVH), i32(hd), i32(16)])
    q = yq[:, :H * hd].reshape(n, H, hd)
    want = rotate(q, cos, sin, pos)
    report(f"{pre} n={n} qkv_rope with fused RMSNorm (q)", rel(host(q_out).reshape(n, H, hd), want), 8e-3)
    vh = from_device_layout(host(vc), KVH, hd, 16)[slots].reshape(n, KVH, hd)
    report(f"{pre} n={n} qkv_rope with fused RMSNorm (v)", rel(vh, yq[:, (H + KVH) * hd:].reshape(n, KVH, hd)), 8e-3)


def fused_block_case(rng, n, H, hd, S, d, ff, empty_splits):
    """Random split-K attention partials (some splits empty) and the weights
    and residual of one layer's second half."""
    qd = H * hd
    m = rng.uniform(-4, 4, size=(n, H, S))
    l = rng.uniform(0.5, 3, size=(n, H, S))
    acc = rnd(rng, n, H, S, hd, scale=2.0)
    if empty_splits:
        m[:, :, S // 2:] = -np.inf  # short contexts leave the last splits empty
        l[:, :, S // 2:] = 0
        acc[:, :, S // 2:] = 0
    c = dict(m=m.astype(np.float32), l=l.astype(np.float32), acc=acc.astype(np.float32))
    c.update(
        x=rnd(rng, n, d, scale=2.0).astype(np.float32).astype(np.float64),
        g=(1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64),
        g2=(1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64),
        wo=bf(rnd(rng, d, qd, scale=0.05)),
        wgu=bf(rnd(rng, 2 * ff, d, scale=0.05)),
        wd=bf(rnd(rng, d, ff, scale=0.05)),
    )
    return c


def fused_block_reference(c, ids, eps, gelu):
    """float64: combine, o_proj into the residual, RMSNorm, gate/up, down;
    bf16 where the kernels store bf16."""
    m, l, acc = (c[k].astype(np.float64) for k in ("m", "l", "acc"))
    top = m.max(-1, keepdims=True)
    f = np.where(np.isfinite(m), np.exp2(m - top), 0.0)
    attn = (acc * f[..., None]).sum(2) / (l * f).sum(-1)[..., None]
    n = attn.shape[0]
    attn_rows = np.empty_like(attn.reshape(n, -1))
    attn_rows[ids] = bf(attn.reshape(n, -1))
    x1 = c["x"] + attn_rows @ c["wo"].T
    xg1 = bf(x1 * c["g"])
    inv = 1 / np.sqrt((x1 ** 2).mean(-1, keepdims=True) + eps)
    ff = c["wgu"].shape[0] // 2
    gate, up = (xg1 @ c["wgu"][:ff].T) * inv, (xg1 @ c["wgu"][ff:].T) * inv
    act = bf((gelu_tanh(gate) if gelu else gate / (1 + np.exp(-gate))) * up)
    x2 = x1 + act @ c["wd"].T
    return x2, bf(x2 * c["g2"]), act


def qkv_case(rng, n, H, KVH, hd, d, bias):
    """The next layer's q/k/v weights, bias and rope/KV-write targets."""
    w = (H + 2 * KVH) * hd
    max_pos, bs, nslots = 1024, 16, 256
    cos, sin = (a.astype(np.float32).astype(np.float64) for a in rope_tables(hd, max_pos, 10000.0))
    return dict(wq=bf(rnd(rng, w, d, scale=0.05)),
                b=rnd(rng, w, scale=0.5).astype(np.float32).astype(np.float64) if bias else None,
                pos=rng.integers(0, max_pos, n), slots=rng.permutation(nslots)[:n], cos=cos, sin=sin,
                H=H, KVH=KVH, hd=hd, bs=bs, nslots=nslots)


def qkv_reference(q, xg2, x2, eps):
    """q, k, v (rotated where rope applies) of the next layer from its
    pre-scaled input and the residual's 1/rms."""
    inv = 1 / np.sqrt((x2 ** 2).mean(-1, keepdims=True) + eps)
    y = (xg2 @ q["wq"].T) * inv + (q["b"] if q["b"] is not None else 0)
    n, H, KVH, hd = len(x2), q["H"], q["KVH"], q["hd"]
    rot = lambda a: rotate(a, q["cos"], q["sin"], q["pos"])  # noqa: E731
    return (rot(y[:, :H * hd].reshape(n, H, hd)), rot(y[:, H * hd:(H + KVH) * hd].reshape(n, KVH, hd)),
            y[:, (H + KVH) * hd:].reshape(n, KVH, hd))


def qkv_buffers(q, n):
    """Device inputs and zeroed outputs of a q/k/v phase: the kernel's
    trailing arguments (null pointers and no heads without one)."""
    if q is None:
        return [ptr(None)] * 9 + [i32(0), i32(1)], None
    H, KVH, hd = q["H"], q["KVH"], q["hd"]
    outs = (torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda"),
            torch.zeros(q["nslots"], KVH * hd, dtype=torch.bfloat16, device="cuda"),
            torch.zeros(q["nslots"], KVH * hd, dtype=torch.bfloat16, device="cuda"))
    args = [ptr(dev(q["wq"], torch.bfloat16)), ptr(dev(q["b"], torch.float32) if q["b"] is not None else None),
            ptr(dev(q["pos"], torch.int32)), ptr(dev(q["slots"], torch.int64)), ptr(dev(q["cos"], torch.float32)),
            ptr(dev(q["sin"], torch.float32)), ptr(outs[0]), ptr(outs[1]), ptr(outs[2]), i32(KVH), i32(q["bs"])]
    return args, outs


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def check_fused_block(mods, rng):
    """fused_block_n*: the second half of a layer (and the next layer's
    q/k/v) in one kernel, against float64 and bit for bit against the
    unfused kernels it replaces (attention_combine, gemv add_f32,
    swiglu_norm, add_f32, qkv_rope_norm)."""
    fb, gemv, att = mods["fused_block"], mods["gemv"], mods["attention"]
    H, KVH, hd, d, ff, eps = 9, 3, 64, 576, 1536, 1e-5
    # (tokens, splits, decode rows permuted, empty splits, grid, activation, next q/k/v: None / bias or not)
    cases = ((1, 32, False, True, 192, "swiglu", False), (1, 32, False, False, 192, "swiglu", None),
             (3, 4, True, False, 192, "swiglu", True), (8, 32, False, False, 40, "swiglu", False),
             (2, 1, False, False, 192, "swiglu", None), (4, 8, False, True, 100, "geglu", False))
    for n, S, permute, empty, grid, act_name, qkv_bias in cases:
        gelu = act_name == "geglu"
        c = fused_block_case(rng, n, H, hd, S, d, ff, empty)
        q = None if qkv_bias is None else qkv_case(rng, n, H, KVH, hd, d, qkv_bias)
        ids = rng.permutation(n) if permute else np.arange(n)
        x2, xg2, act = fused_block_reference(c, ids, eps, gelu)
        ml = np.stack([c["m"], c["l"]], -1).reshape(-1)
        part_acc, part_ml = dev(c["acc"].reshape(-1), torch.float32), dev(ml, torch.float32)
        idsd = dev(ids, torch.int32) if permute else None
        attn = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
        if S == 1:  # one split: the attention wrote its rows itself
            attn = dev(fused_block_reference_attn(c, ids), torch.bfloat16)
        wo, wgu, wd = (dev(c[k], torch.bfloat16) for k in ("wo", "wgu", "wd"))
        g, g2 = dev(c["g"], torch.float32), dev(c["g2"], torch.float32)
        what = (f"fused_block n={n} splits={S} grid={grid} {act_name}{' permuted rows' if permute else ''}"
                f"{'' if q is None else ' + next q/k/v' + (' bias' if qkv_bias else '')}")
        outs = []
        for fused in (True, False):
            xn = torch.zeros(n, d, dtype=torch.bfloat16, device="cuda")
            actd = torch.zeros(n, ff, dtype=torch.bfloat16, device="cuda")
            ssb = sumsq_buffer()
            qargs, qouts = qkv_buffers(q, n)
            if fused:
                # Twice: the barrier state must be ready again after a launch.
                for _ in range(2):
                    x = dev(c["x"], torch.float32)
                    launch(fb.fn(f"fused_block_n{n}_{act_name}"), (grid,), 256,
                           [ptr(part_acc), ptr(part_ml), ptr(idsd), ptr(attn), i32(H), i32(hd), i32(S), ptr(wo),
                            ptr(x), ptr(g), ptr(xn), ptr(ssb), f32(eps), ptr(wgu), ptr(actd), ptr(wd), ptr(g2),
                            i32(d), i32(ff)] + qargs)
            else:
                x = dev(c["x"], torch.float32)
                a = attn.clone()
                if S > 1:
                    launch(att.fn("attention_combine"), (n, H), 128,
                           [ptr(part_acc), ptr(part_ml), ptr(idsd), ptr(a), i32(H), i32(hd), i32(S)])
                launch(gemv.fn(f"gemv_n{n}_add_f32"), (d // 8,), 256,
                       [ptr(a), ptr(wo), ptr(x), i32(H * hd), i32(d), ptr(ssb), ptr(g), ptr(xn)])
                launch(gemv.fn(f"gemv_n{n}_{act_name}_norm"), (ff // 8,), 256,
                       [ptr(xn), f32(eps), ptr(ssb), ptr(wgu), ptr(actd), i32(d), i32(ff)])
                launch(gemv.fn(f"gemv_n{n}_add_f32"), (d // 8,), 256,
                       [ptr(actd), ptr(wd), ptr(x), i32(ff), i32(d), ptr(ssb), ptr(g2), ptr(xn)])
                if q is not None:
                    width = (H + 2 * KVH) * hd
                    launch(gemv.fn(f"gemv_n{n}_qkv_rope_norm"), (math.ceil(width / 8),), 256,
                           [ptr(xn), f32(eps), ptr(ssb), qargs[0], i32(d)] + qargs[1:9] + [i32(H), i32(KVH), i32(hd),
                                                                                        i32(q["bs"])])
            outs.append([x, xn, actd, ssb[8:]] + list(qouts or ()))
            if not fused:
                continue
            got_ss, blocks = sumsq_rows(ssb, n)
            # Against the kernel's own bf16 activations for the down product:
            # an activation that rounds one bf16 ulp away from the float64
            # one (a near-tie) moves the residual by up to ~2e-4 of its
            # scale; the activations have their own check below.
            x2_own = x2 - act @ c["wd"].T + host(actd).astype(np.float64) @ c["wd"].T
            report(f"{what}: residual", rel(host(x), x2_own), 1e-4)
            report(f"{what}: next norm's pre-scaled input", rel(host(xn), xg2), 8e-3)
            report(f"{what}: activations", rel(host(actd), act), 1.6e-2)
            report(f"{what}: sums of squares", rel(got_ss, (x2 ** 2).sum(-1)), 1e-4)
            report(f"{what}: one partial per o_proj task", abs(blocks - d // 8), 0.5)
            if q is not None:
                wq_, wk, wv = qkv_reference(q, xg2, x2, eps)
                kh = from_device_layout(host(qouts[1]), KVH, hd, q["bs"])[q["slots"]].reshape(n, KVH, hd)
                vh = from_device_layout(host(qouts[2]), KVH, hd, q["bs"])[q["slots"]].reshape(n, KVH, hd)
                report(f"{what}: next q", rel(host(qouts[0]).reshape(n, H, hd), wq_), 1.6e-2)
                report(f"{what}: next k -> cache", rel(kh, wk), 1.6e-2)
                report(f"{what}: next v -> cache", rel(vh, wv), 1.6e-2)
        same = all(torch.equal(bits(a), bits(b)) for a, b in zip(*outs))
        report(f"{what}: same bits as the unfused kernels", 0.0 if same else 1.0, 0.5)


def fused_block_reference_attn(c, ids):
    """The attention rows a one-split attention writes itself (bf16)."""
    n, H, _, hd = c["acc"].shape
    rows = np.empty((n, H * hd))
    rows[ids] = (c["acc"][:, :, 0] / c["l"][:, :, :1]).reshape(n, -1)
    return bf(rows)


def check_qkv_rope(m, rng):
    """Fused q/k/v GEMV + bias + rope + paged KV write vs GEMV then the reference rope."""
    for pre, n, H, KVH, hd, d, bias in (("gemv", 1, 9, 3, 64, 576, False), ("gemv", 4, 32, 8, 128, 4096, True),
                                        ("gemv", 7, 9, 3, 64, 576, True), ("gemv_short", 1, 9, 3, 64, 576, False),
                                        ("gemv_short", 6, 9, 3, 64, 576, True), ("gemv_short", 8, 16, 8, 128, 2048, True)):
        w = (H + 2 * KVH) * hd
        x = bf(rnd(rng, n, d))
        wq = bf(rnd(rng, w, d, scale=0.05))
        b = rnd(rng, w, scale=0.5).astype(np.float32).astype(np.float64) if bias else np.zeros(w)
        y = x @ wq.T + b
        max_pos, bs, nslots = 4096, 16, 512
        pos = rng.integers(0, max_pos, n)
        slots = rng.permutation(nslots)[:n]
        cos, sin = (a.astype(np.float32).astype(np.float64) for a in rope_tables(hd, max_pos, 10000.0))
        q_out = torch.zeros(n, H * hd, dtype=torch.bfloat16, device="cuda")
        kc = torch.zeros(nslots, KVH * hd, dtype=torch.bfloat16, device="cuda")
        vc = torch.zeros(nslots, KVH * hd, dtype=torch.bfloat16, device="cuda")
        args = [ptr(dev(x, torch.bfloat16)), ptr(dev(wq, torch.bfloat16)), i32(d), ptr(dev(b, torch.float32) if bias else None),
                ptr(dev(pos, torch.int32)), ptr(dev(slots, torch.int64)), ptr(dev(cos, torch.float32)), ptr(dev(sin, torch.float32)),
                ptr(q_out), ptr(kc), ptr(vc), i32(H), i32(KVH), i32(hd), i32(bs)]
        launch(m.fn(f"{pre}_n{n}_qkv_rope"), (math.ceil(w / 8),), 256, args)

        def rot(a):
            return rotate(a, cos, sin, pos)

        q = y[:, :H * hd].reshape(n, H, hd)
        k = y[:, H * hd:(H + KVH) * hd].reshape(n, KVH, hd)
        v = y[:, (H + KVH) * hd:].reshape(n, KVH, hd)
        kh = from_device_layout(host(kc), KVH, hd, bs)[slots].reshape(n, KVH, hd)
        vh = from_device_layout(host(vc), KVH, hd, bs)[slots].reshape(n, KVH, hd)
        tag = f"{pre} n={n} H={H} KVH={KVH} hd={hd}{' bias' if bias else ''}"
        report(f"gemv qkv_rope q {tag}", rel(host(q_out).reshape(n, H, hd), rot(q)), 8e-3)
        report(f"gemv qkv_rope k -> cache {tag}", rel(kh, rot(k)), 8e-3)
        report(f"gemv qkv_rope v -> cache {tag}", rel(vh, v), 8e-3)


def moe_route_reference(logits, k, normalize):
    """Top k by logit (ties to the lower expert), softmax weights (renormalised), ascending expert order."""
    ids, weights = [], []
    for row in logits:
        p = np.exp(row - row.max())
        p /= p.sum()
        top = np.argsort(-row, kind="stable")[:k]
        w = p[top] / (p[top].sum() if normalize else 1.0)
        order = np.argsort(top)
        ids.append(top[order])
        weights.append(w[order])
    return np.array(ids), np.array(weights)


def check_moe(m, rng):
    """moe_router (f32 norm + logits from the f32 residual), moe_route (top k with ties, weights),
    moe_gate_up_silu and moe_down_sum (every slot's expert, the weighted sum into the residual)."""
    T, d, E, k, ff, eps = 37, 256, 40, 6, 96, 1e-6
    x = rnd(rng, T, d).astype(np.float32).astype(np.float64)
    g = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    router = bf(rnd(rng, E, d, scale=0.2))
    router[7] = router[3]  # experts 3 and 7 tie on every token
    logits = torch.empty(T, E, dtype=torch.float32, device="cuda")
    xn_out = torch.full((T, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    x_d, g_d, router_d = dev(x, torch.float32), dev(g, torch.float32), dev(router, torch.bfloat16)

    def router_args(out, xn_buf):
        return [ptr(x_d), ptr(g_d), ptr(router_d), i32(d), f32(eps), i32(E), ptr(out), ptr(xn_buf)]

    launch(m.fn("moe_router"), (T, math.ceil(E / 8)), 256, router_args(logits, xn_out))
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    report("moe_router f32 logits", rel(host(logits), xn @ router.T), 1e-5)
    report("moe_router: the normed row in bf16", rel(host(xn_out), xn), 8e-3)
    again = torch.empty(T, E, dtype=torch.float32, device="cuda")
    launch(m.fn("moe_router"), (T, math.ceil(E / 8)), 256, router_args(again, None))
    report("moe_router without xn: the same logits", float(np.max(np.abs(host(again) - host(logits)))), 1e-30)
    got_logits = host(logits)
    report("moe_router: tied experts get equal logits", float(np.max(np.abs(got_logits[:, 3] - got_logits[:, 7]))), 1e-30)
    # Route the kernel's own logits (so ties are exact), with expert 3/7 forced into contention on some rows.
    lg = got_logits.copy()
    lg[::3, 3] = lg[::3, 7] = np.sort(lg[::3], axis=1)[:, -k] + 1e-3  # both at the k-th place: one is in
    for normalize in (0, 1):
        ids = torch.empty(T, k, dtype=torch.int32, device="cuda")
        w = torch.empty(T, k, dtype=torch.float32, device="cuda")
        launch(m.fn("moe_route"), (math.ceil(T / 8),), 256, [ptr(dev(lg, torch.float32)), i32(T), i32(E), i32(k),
                                                             i32(normalize), ptr(ids), ptr(w)])
        want_ids, want_w = moe_route_reference(lg.astype(np.float32).astype(np.float64), k, normalize)
        report(f"moe_route ids (normalize {normalize}), ties to the lower expert",
               float(np.sum(ids.cpu().numpy() != want_ids)), 0.5)
        report(f"moe_route weights (normalize {normalize})", rel(host(w), want_w), 1e-5)
    # Experts on the routed slots.
    gate, up = bf(rnd(rng, E, ff, d, scale=0.1)), bf(rnd(rng, E, ff, d, scale=0.1))
    down = bf(rnd(rng, E, d, ff, scale=0.1))
    xb = bf(xn)
    # The several-token kernels, then the one-token ones (`_b1`, inputs staged in shared memory;
    # general in the token count, so checked at the same shapes).
    for sfx in ("", "_b1"):
        b1 = sfx == "_b1"
        act = torch.empty(T * k, ff, dtype=torch.bfloat16, device="cuda")
        launch(m.fn("moe_gate_up_silu" + sfx), (T * k, math.ceil(ff / 8)), 256,
               [ptr(dev(xb, torch.bfloat16)), ptr(dev(gate, torch.bfloat16)), ptr(dev(up, torch.bfloat16)), ptr(ids),
                i32(k), i32(d), i32(ff), ptr(act)], smem=2 * d if b1 else 0)
        e = ids.cpu().numpy().reshape(-1)
        tok = np.repeat(np.arange(T), k)
        gv = np.einsum("sfd,sd->sf", gate[e], xb[tok])
        uv = np.einsum("sfd,sd->sf", up[e], xb[tok])
        want_act = gv / (1 + np.exp(-gv)) * uv
        report(f"moe_gate_up_silu{sfx} (bf16 out)", rel(host(act), want_act), 8e-3)
        base = rnd(rng, T, d).astype(np.float32).astype(np.float64)
        resid = dev(base, torch.float32)
        down_smem = 2 * k * ff if b1 else 0
        launch(m.fn("moe_down_sum" + sfx), (T, math.ceil(d / 8)), 256,
               [ptr(act), ptr(dev(down, torch.bfloat16)), ptr(ids), ptr(w), i32(k), i32(d), i32(ff), ptr(resid),
                ptr(None), ptr(None), ptr(None)], smem=down_smem)
        a = host(act)
        per_slot = np.einsum("sdf,sf->sd", down[e], a) * host(w).reshape(-1)[:, None]
        want = base + per_slot.reshape(T, k, d).sum(1)
        report(f"moe_down_sum{sfx} into the residual", rel(host(resid), want), 1e-5)
        # Decode (8 tokens): the down sum also leaves the next norm fused for its GEMV, the updated
        # rows' sums of squares (a partial per block) and the pre-scaled bf16 input.
        n = 8
        resid = dev(base[:n], torch.float32)
        ssb = sumsq_buffer()
        xg = torch.empty(n, d, dtype=torch.bfloat16, device="cuda")
        launch(m.fn("moe_down_sum" + sfx), (n, math.ceil(d / 8)), 256,
               [ptr(act), ptr(dev(down, torch.bfloat16)), ptr(ids), ptr(w), i32(k), i32(d), i32(ff), ptr(resid),
                ptr(ssb), ptr(dev(g, torch.float32)), ptr(xg)], smem=down_smem)
        report(f"moe_down_sum{sfx} (8 tokens) into the residual", rel(host(resid), want[:n]), 1e-5)
        got, blocks = sumsq_rows(ssb, n)
        report(f"moe_down_sum{sfx}: the updated rows' sums of squares", rel(got, (host(resid) ** 2).sum(-1)), 1e-5)
        report(f"moe_down_sum{sfx}: a partial per block of 8 rows", abs(blocks - d // 8), 0.5)
        report(f"moe_down_sum{sfx}: the next norm's pre-scaled input", rel(host(xg), host(resid) * g), 4e-3)
    check_moe_wide(m, rng)
    check_moe_grouped(m, rng)


def check_moe_wide(m, rng):
    """Shapes past the kernels' loads in flight: a router row of 2,056 (its lanes load 2,048 before the
    wait, the rest after) and a down sum of 8 slots of 1,024 (more chunks than a lane's group)."""
    T, d, E, eps = 3, 2056, 24, 1e-6
    x = rnd(rng, T, d).astype(np.float32).astype(np.float64)
    g = (1 + 0.2 * rnd(rng, d)).astype(np.float32).astype(np.float64)
    router = bf(rnd(rng, E, d, scale=0.2))
    logits = torch.empty(T, E, dtype=torch.float32, device="cuda")
    launch(m.fn("moe_router"), (T, math.ceil(E / 8)), 256,
           [ptr(dev(x, torch.float32)), ptr(dev(g, torch.float32)), ptr(dev(router, torch.bfloat16)), i32(d), f32(eps),
            i32(E), ptr(logits), ptr(None)])
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    report(f"moe_router f32 logits, hidden {d}", rel(host(logits), xn @ router.T), 1e-5)
    T, d, E, k, ff = 3, 64, 12, 8, 1024
    e = np.stack([np.sort(rng.choice(E, k, replace=False)) for _ in range(T)])
    wts = rng.uniform(0.05, 0.5, size=(T, k))
    act = bf(rnd(rng, T * k, ff))
    down = bf(rnd(rng, E, d, ff, scale=0.05))
    base = rnd(rng, T, d).astype(np.float32).astype(np.float64)
    per_slot = np.einsum("sdf,sf->sd", down[e.reshape(-1)], act) * wts.astype(np.float32).reshape(-1)[:, None]
    for sfx in ("", "_b1"):
        resid = dev(base, torch.float32)
        launch(m.fn("moe_down_sum" + sfx), (T, math.ceil(d / 8)), 256,
               [ptr(dev(act, torch.bfloat16)), ptr(dev(down, torch.bfloat16)), ptr(dev(e, torch.int32)),
                ptr(dev(wts, torch.float32)), i32(k), i32(d), i32(ff), ptr(resid), ptr(None), ptr(None), ptr(None)],
               smem=2 * k * ff if sfx else 0)
        report(f"moe_down_sum{sfx}, {k} slots of {ff}", rel(host(resid), base + per_slot.reshape(T, k, d).sum(1)),
               1e-5)


def moe_tiles(T, k, E):
    """Tiles `moe_align` may fill (runner-cuda's MoeAlign::tiles)."""
    return -(-(T * k) // 64) + min(E, T * k)


def moe_grouped_run(m, xb, ids, w, gate, up, down, resid, T, k, E, ff, d, gelu=False, scales=None):
    """The grouped path (moe_align, moe_grouped_gate_up_*, moe_grouped_down, moe_weighted_sum) as
    the runner launches it; returns (sorted, tile_expert, act). With `scales` (gate's, up's and
    down's row scales) the stacks are e4m3 and the *_e4m3 kernels run."""
    tiles = moe_tiles(T, k, E)
    sorted_ = torch.empty(tiles * 64, dtype=torch.int32, device="cuda")
    tile_expert = torch.empty(tiles, dtype=torch.int32, device="cuda")
    launch(m.fn("moe_align"), (1,), 1024, [ptr(ids), i32(T * k), i32(E), i32(tiles), ptr(sorted_), ptr(tile_expert)])
    act = torch.full((T * k, ff), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = torch.full((T * k, d), float("nan"), dtype=torch.float32, device="cuda")
    suffix = "_e4m3" if scales else ""
    gate_up_scales = [ptr(scales[0]), ptr(scales[1])] if scales else []
    name = ("moe_grouped_gate_up_gelu_tanh" if gelu else "moe_grouped_gate_up_silu") + suffix
    launch(m.fn(name), (ff // 64, tiles), 128,
           [ptr(xb), i32(k), ptr(gate), ptr(up)] + gate_up_scales
           + [i32(ff), i32(d), ptr(sorted_), ptr(tile_expert), ptr(act)])
    launch(m.fn("moe_grouped_down" + suffix), (d // 128, tiles), 128,
           [ptr(act), ptr(down)] + ([ptr(scales[2])] if scales else [])
           + [i32(d), i32(ff), ptr(sorted_), ptr(tile_expert), ptr(out)])
    launch(m.fn("moe_weighted_sum"), (T,), 256, [ptr(out), ptr(w), i32(k), i32(d), ptr(resid)])
    return sorted_, tile_expert, act


def check_moe_grouped(m, rng):
    """The grouped expert GEMMs on the tensor cores: the slots sorted by expert (each once, tiles
    padded with -1), every slot's gated activation and the weighted down sums, against float64, at
    one token (most experts empty), a few tiles and experts spanning several tiles; GELU once."""
    d, E, k, ff = 256, 40, 6, 128
    gate, up = bf(rnd(rng, E, ff, d, scale=0.1)), bf(rnd(rng, E, ff, d, scale=0.1))
    down = bf(rnd(rng, E, d, ff, scale=0.1))
    gate_d, up_d, down_d = dev(gate, torch.bfloat16), dev(up, torch.bfloat16), dev(down, torch.bfloat16)
    for T, gelu in ((1, False), (37, False), (300, False), (300, True)):
        rest = np.array([x for x in range(E) if x != 5])
        # Half the tokens choose expert 5: at T = 300 it takes three tiles.
        e = np.sort(np.stack([np.append(rng.choice(rest, k - 1, replace=False), 5) if t < T // 2
                              else rng.choice(E, k, replace=False) for t in range(T)]), 1)
        ids = dev(e, torch.int32)
        wts = rng.uniform(0.05, 0.5, size=(T, k))
        w = dev(wts, torch.float32)
        xb = bf(rnd(rng, T, d))
        base = rnd(rng, T, d).astype(np.float32).astype(np.float64)
        resid = dev(base, torch.float32)
        sorted_, tile_expert, act = moe_grouped_run(m, dev(xb, torch.bfloat16), ids, w, gate_d, up_d, down_d, resid,
                                                    T, k, E, ff, d, gelu)
        srt, te = sorted_.cpu().numpy().reshape(-1, 64), tile_expert.cpu().numpy()
        flat = e.reshape(-1)
        placed = srt[srt >= 0]
        good = sorted(placed.tolist()) == list(range(T * k)) and all(
            te[i] >= 0 and np.all(flat[r[r >= 0]] == te[i]) for i, r in enumerate(srt) if (r >= 0).any())
        used = te[te >= 0]
        good = good and np.all(np.diff(used) >= 0) and np.all(te[len(used):] == -1)
        report(f"moe_align T={T}: every slot once, tiles of one expert", 0.0 if good else 1.0, 0.5)
        tok = np.repeat(np.arange(T), k)
        gv = np.einsum("sfd,sd->sf", gate[flat], xb[tok])
        uv = np.einsum("sfd,sd->sf", up[flat], xb[tok])
        want_act = (gelu_tanh(gv) if gelu else gv / (1 + np.exp(-gv))) * uv
        tag = f"T={T}{' gelu' if gelu else ''}"
        report(f"moe_grouped_gate_up {tag} (bf16 out)", rel(host(act), want_act), 8e-3)
        per_slot = np.einsum("sdf,sf->sd", down[flat], host(act)) * host(w).reshape(-1)[:, None]
        report(f"moe_grouped_down + weighted_sum {tag}", rel(host(resid), base + per_slot.reshape(T, k, d).sum(1)),
               1e-5)


def e4m3_rows(w):
    """A stack's rows in e4m3 with row scales (absmax / 448, as quantize_rows_e4m3): the device
    bytes, the device scales and the dequantized float64 values the kernels must multiply by."""
    rows = w.reshape(-1, w.shape[-1])
    s = np.maximum(np.abs(rows).max(1), 1e-30) / 448.0
    q = torch.tensor(rows / s[:, None]).to(torch.float8_e4m3fn)
    deq = (q.double().numpy() * s[:, None]).reshape(w.shape)
    return q.view(torch.uint8).cuda(), dev(s, torch.float32), deq


def check_moe_e4m3(m, rng):
    """FP8 experts: the per-slot GEMVs (moe_gate_up_*_e4m3, moe_down_sum_e4m3) and the grouped
    GEMMs over e4m3 stacks (B fragments converted from the staged bytes, row scales in the
    epilogue) against float64 over the dequantized weights: at 37 tokens, then grouped at one
    token, a few tiles and an expert spanning several tiles, GELU once."""
    d, E, k, ff = 256, 40, 6, 384  # the e4m3 down sum: two rounds of loads a lane
    (gq, gs, gate), (uq, us, up) = e4m3_rows(rnd(rng, E, ff, d, scale=0.1)), e4m3_rows(rnd(rng, E, ff, d, scale=0.1))
    dq, ds, down = e4m3_rows(rnd(rng, E, d, ff, scale=0.1))
    for T, gelu, grouped, sfx in ((37, False, False, ""), (37, True, False, ""), (37, False, False, "_b1"),
                                  (37, True, False, "_b1"), (1, False, True, ""), (300, False, True, ""),
                                  (300, True, True, "")):
        # Half the tokens choose expert 5: at T = 300 it takes three tiles.
        rest = np.array([x for x in range(E) if x != 5])
        e = np.sort(np.stack([np.append(rng.choice(rest, k - 1, replace=False), 5) if t < T // 2
                              else rng.choice(E, k, replace=False) for t in range(T)]), 1)
        ids, flat = dev(e, torch.int32), e.reshape(-1)
        wts = rng.uniform(0.05, 0.5, size=(T, k))
        w = dev(wts, torch.float32)
        xb = bf(rnd(rng, T, d))
        base = rnd(rng, T, d).astype(np.float32).astype(np.float64)
        resid = dev(base, torch.float32)
        tag = f"T={T}{' gelu' if gelu else ''}{sfx}"
        if grouped:
            _, _, act = moe_grouped_run(m, dev(xb, torch.bfloat16), ids, w, gq, uq, dq, resid, T, k, E, ff, d, gelu,
                                        (gs, us, ds))
            tag = "grouped " + tag
        else:
            act = torch.empty(T * k, ff, dtype=torch.bfloat16, device="cuda")
            name = ("moe_gate_up_gelu_tanh_e4m3" if gelu else "moe_gate_up_silu_e4m3") + sfx
            launch(m.fn(name), (T * k, math.ceil(ff / 8)), 256,
                   [ptr(dev(xb, torch.bfloat16)), ptr(gq), ptr(uq), ptr(gs), ptr(us), ptr(ids), i32(k), i32(d),
                    i32(ff), ptr(act)], smem=2 * d if sfx else 0)
            launch(m.fn("moe_down_sum_e4m3" + sfx), (T, math.ceil(d / 8)), 256,
                   [ptr(act), ptr(dq), ptr(ds), ptr(ids), ptr(w), i32(k), i32(d), i32(ff), ptr(resid),
                    ptr(None), ptr(None), ptr(None)])
        tok = np.repeat(np.arange(T), k)
        gv = np.einsum("sfd,sd->sf", gate[flat], xb[tok])
        uv = np.einsum("sfd,sd->sf", up[flat], xb[tok])
        want_act = (gelu_tanh(gv) if gelu else gv / (1 + np.exp(-gv))) * uv
        report(f"moe e4m3 gate_up {tag} (bf16 out)", rel(host(act), want_act), 8e-3)
        per_slot = np.einsum("sdf,sf->sd", down[flat], host(act)) * wts.astype(np.float32).reshape(-1)[:, None]
        report(f"moe e4m3 down sum {tag}", rel(host(resid), base + per_slot.reshape(T, k, d).sum(1)), 1e-5)


# (name, module, check), in the order they run.
CHECKS = [
    ("elementwise", "elementwise", check_elementwise),
    ("sampling", "sampling", check_sampling),
    ("logit_bias", "sampling", check_logit_bias),
    ("rope", "rope", check_rope),
    ("attention", "attention", check_attention),
    ("gemv", "gemv", check_gemv),
    ("gemv_whole4k", "gemv", check_gemv_whole4k),
    ("gemv_tc", "gemv_tc", check_gemv_tc),
    ("qkv_rope", "gemv", check_qkv_rope),
    ("fused_norm", "gemv", check_fused_norm),
    ("moe", "moe", check_moe),
    ("moe_e4m3", "moe", check_moe_e4m3),
    ("collective", "collective", check_collective),
    ("fused_block", None, check_fused_block),  # takes every module
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", required=True, help="folder with elementwise/rope/attention .sm_90.cubin")
    ap.add_argument("--only", choices=[c[0] for c in CHECKS], help="run one group of checks")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")  # makes the primary context current for the driver calls
    # Only the modules the chosen checks use are loaded (`--only logit_bias`
    # needs just sampling's cubin).
    chosen = [c for c in CHECKS if args.only in (None, c[0])]
    names = {m for _, m, _ in chosen if m} if all(m for _, m, _ in chosen) else \
        {"elementwise", "rope", "attention", "gemv", "gemv_tc", "sampling", "fused_block", "moe", "collective"}
    mods = {n: Module(os.path.join(args.cubins, f"{n}.sm_90.cubin")) for n in names}
    for name, module, check in chosen:
        # Each group draws from its own seed: its data does not depend on
        # which groups ran before it (`--only` sees what a full run sees).
        check(mods[module] if module else mods, np.random.default_rng(zlib.crc32(name.encode())))
    print(f"kernel checks: {'all passed' if not FAILS else 'FAILED: ' + ', '.join(FAILS)}")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
