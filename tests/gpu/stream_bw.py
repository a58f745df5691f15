"""HBM stream rates on the GPU machine: a read-only reduction, a copy, and
cuBLAS's bf16 GEMV on the 8B's gate/up shape (docs/perf/large-batch.md, "Floors")."""
import torch
n = 8 * 1024**3 // 2  # 8 GiB of bf16
x = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_()
y = torch.empty_like(x)
def t(f, reps=10):
    f(); torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps / 1e3
b = x.numel() * 2
print(torch.cuda.get_device_name())
print("read-only sum      %.3f TB/s" % (b / t(lambda: x.sum(dtype=torch.float32)) / 1e12))
print("copy (r+w)         %.3f TB/s" % (2 * b / t(lambda: y.copy_(x)) / 1e12))
# GEMV-like: bf16 matrix [14336*2, 4096] x vector, as cuBLAS does it
W = x[: 28672 * 4096].view(28672, 4096); v = torch.randn(4096, 1, dtype=torch.bfloat16, device="cuda")
print("cuBLAS GEMV 28672x4096 %.3f TB/s" % (W.numel() * 2 / t(lambda: W @ v, 50) / 1e12))
