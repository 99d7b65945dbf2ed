"""torch.add of two 256 MiB float tensors on cuda:0 next to a device copy, in
bytes read + written per second: the peer the fused reduce-copy kernel is
measured against (tests/gpu/kern_bitwise)."""
import torch

n = (256 << 20) // 4
a = torch.rand(n, device="cuda")
b = torch.rand(n, device="cuda")
c = torch.empty_like(a)


def best_ms(fn, reps=12):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return min(times[2:])


add = best_ms(lambda: torch.add(a, b, out=c))
copy = best_ms(lambda: c.copy_(a))
print(f"torch.add, 256 MiB: {add:.3f} ms = {3 * 4 * n / add / 1e6:.0f} GB/s; "
      f"copy_ {copy:.3f} ms = {2 * 4 * n / copy / 1e6:.0f} GB/s (torch {torch.__version__})")
