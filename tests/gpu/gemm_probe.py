"""cuBLAS (through torch) on the 8B layer GEMM shapes at decode-sized token counts:
time, weight bytes / time and TFLOP/s, the reference ingot's cuBLASLt decode GEMMs
are compared with. Run on the GPU machine: python3 tests/gpu/gemm_probe.py"""
import torch, time
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
print(f"{'M':>4} {'shape':8} {'us':>8} {'TB/s(w)':>8} {'TFLOP/s':>8}")
for M in (16, 64, 128, 192, 256, 384, 512):
    tot = 0
    for name, (N, K) in shapes.items():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for _ in range(3): y = x @ w.T
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(20): y = x @ w.T
        e.record(); torch.cuda.synchronize()
        us = s.elapsed_time(e) / 20 * 1e3
        tot += us
        print(f"{M:4d} {name:8} {us:8.1f} {N*K*2/us/1e6:8.2f} {2*M*N*K/us/1e6:8.1f}")
    print(f"{M:4d} layer total {tot:.1f} us -> 32 layers {tot*32/1e3:.2f} ms; weights/time {436.2e6/tot/1e6:.2f} TB/s")
