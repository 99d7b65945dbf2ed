"""torch.add of two 256 MiB tensors on cuda:0 next to a device copy, for
every type PyTorch adds on the GPU, in bytes read + written per second: the
peer the fused reduce-copy kernel is measured against (tests/gpu/kern_bitwise,
whose type names these are; perf/gpu_bench.sh puts the two side by side)."""
import torch

TYPES = [("int8", torch.int8), ("uint8", torch.uint8), ("int32", torch.int32),
         ("int64", torch.int64), ("half", torch.float16), ("float", torch.float32),
         ("double", torch.float64), ("bf16", torch.bfloat16)]


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


for name, dtype in TYPES:
    nbytes = 256 << 20
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    a = torch.ones(n, device="cuda", dtype=dtype)
    b = torch.ones(n, device="cuda", dtype=dtype)
    c = torch.empty_like(a)
    add = best_ms(lambda: torch.add(a, b, out=c))
    copy = best_ms(lambda: c.copy_(a))
    print(f"torch.add {name}, 256 MiB: {add:.3f} ms = {3 * nbytes / add / 1e6:.0f} GB/s; "
          f"copy_ {copy:.3f} ms = {2 * nbytes / copy / 1e6:.0f} GB/s (torch {torch.__version__})")
    del a, b, c
