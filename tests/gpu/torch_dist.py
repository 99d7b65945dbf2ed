"""PyTorch's NCCL process group on Braid: WORLD processes (argument, default
2) on cuda:0, each call checked against what it must produce, then 50 DDP
steps compared with the same training in one process, then a 256 MiB float
all_reduce timed on Braid ("nccl") and on torch's "gloo" backend over the same
CUDA tensors (gloo is the one other backend that runs several ranks on one
GPU). Run with Braid's libnccl.so.2 preloaded (libtorch_cuda.so finds the
wheel's NCCL through its RPATH otherwise) and NCCL_DEBUG=INFO with
NCCL_DEBUG_SUBSYS=INIT,TUNING, so the log shows which library and which
algorithm ran:

  LD_PRELOAD=build/lib/libnccl.so.2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    python3 tests/gpu/torch_dist.py 4
"""
import os
import sys

import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = int(sys.argv[1]) if len(sys.argv) > 1 else 2
BIG = 256 << 20  # bytes of the timed all_reduce
STEPS = 50


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x = torch.randn(STEPS, WORLD * 16, 32)
    y = torch.randint(0, 10, (STEPS, WORLD * 16))
    return model, x, y


def train(model, x, y, lo, hi, dev):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[s, lo:hi].to(dev)), y[s, lo:hi].to(dev))
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def check(name, got, want, bad):
    ok = torch.equal(got.cpu(), want.cpu()) if got.dtype != torch.float32 else torch.allclose(
        got.cpu(), want.cpu(), rtol=0, atol=1e-6)
    print(f"[rank {dist.get_rank()}] {name}: {'ok' if ok else 'WRONG'}", flush=True)
    if not ok:
        print(f"  got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}", flush=True)
    return bad + (0 if ok else 1)


def collectives(rank, dev):
    bad = 0
    n = 1 << 20
    k = WORLD
    tri = k * (k - 1) // 2  # sum of the ranks
    base = torch.arange(n, dtype=torch.float32, device=dev)
    t = base + rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    bad = check("all_reduce sum", t, k * base + tri, bad)
    t = base * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    bad = check("all_reduce avg", t, base * (tri + k) / k, bad)
    t = torch.full((1000,), float(rank), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    bad = check("all_reduce max", t, torch.full((1000,), float(k - 1)), bad)
    t = torch.full((4097,), rank, dtype=torch.int64, device=dev) + 7
    dist.broadcast(t, src=1)
    bad = check("broadcast", t, torch.full((4097,), 8, dtype=torch.int64), bad)
    out = torch.empty(k * 3001, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3001,), float(rank + 1), dtype=torch.bfloat16, device=dev))
    want = torch.cat([torch.full((3001,), float(r + 1)) for r in range(k)]).to(torch.bfloat16)
    bad = check("all_gather_into_tensor", out, want, bad)
    inp = torch.arange(k * 5000, dtype=torch.float32, device=dev) * (rank + 1)
    out = torch.empty(5000, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    want = torch.arange(rank * 5000, (rank + 1) * 5000, dtype=torch.float32) * (tri + k)
    bad = check("reduce_scatter_tensor", out, want, bad)
    inp = torch.arange(k * 777, dtype=torch.int32, device=dev) + 10000 * rank
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * 777, (rank + 1) * 777, dtype=torch.int32) + 10000 * r for r in range(k)])
    bad = check("all_to_all_single", out, want, bad)
    if rank == 0:
        dist.send(torch.arange(12345, dtype=torch.float16, device=dev), dst=1)
        r = torch.empty(999, dtype=torch.int8, device=dev)
        dist.recv(r, src=1)
        bad = check("recv", r, torch.full((999,), 5, dtype=torch.int8), bad)
    elif rank == 1:
        r = torch.empty(12345, dtype=torch.float16, device=dev)
        dist.recv(r, src=0)
        bad = check("recv", r, torch.arange(12345, dtype=torch.float16), bad)
        dist.send(torch.full((999,), 5, dtype=torch.int8, device=dev), dst=0)
    dist.barrier(device_ids=[0])
    torch.cuda.synchronize()
    return bad


def time_all_reduce(t, group, iters):
    """Median seconds of one all_reduce of t over group (synchronised on the GPU and the group)."""
    times = []
    for i in range(iters + 2):
        dist.barrier(group=group)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        if i >= 2:  # two warm-ups
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def versus_gloo(rank, dev):
    """256 MiB float all_reduce on Braid and on gloo over the same CUDA tensor;
    the result checked after each (every rank adds rank + 1)."""
    n = BIG // 4
    t = torch.empty(n, dtype=torch.float32, device=dev)
    gloo = dist.new_group(backend="gloo")
    bad = 0
    res = {}
    for name, group, iters in (("braid", None, 5), ("gloo", gloo, 3)):
        t.fill_(float(rank + 1))
        sec = time_all_reduce(t, group, iters)
        t.fill_(float(rank + 1))
        dist.all_reduce(t, group=group)
        bad = check(f"{name} 256 MiB all_reduce", t[:: 1 << 16], torch.full((n >> 16,), float(WORLD * (WORLD + 1) // 2)), bad)
        res[name] = sec
    if rank == 0:
        print(f"torch_dist: 256 MiB all_reduce, {WORLD} processes on cuda:0: braid {res['braid'] * 1e3:.2f} ms "
              f"({BIG / res['braid'] / 1e9:.1f} GB/s algbw), gloo {res['gloo'] * 1e3:.1f} ms "
              f"({BIG / res['gloo'] / 1e9:.2f} GB/s): braid {res['gloo'] / res['braid']:.1f}x gloo", flush=True)
    dist.destroy_process_group(gloo)
    return bad


def worker(rank, port, ref, result):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    bad = collectives(rank, dev)
    model, x, y = model_and_data()
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[0])
    part = x.shape[1] // WORLD
    params = train(ddp, x, y, rank * part, (rank + 1) * part, dev)
    diff = (params - ref).abs().max().item()
    print(f"[rank {rank}] DDP {STEPS} steps vs one process: max |diff| {diff:.3g}", flush=True)
    bad += 0 if diff < 1e-5 else 1
    bad += versus_gloo(rank, dev)
    dist.destroy_process_group()
    result[rank] = bad


def main():
    model, x, y = model_and_data()
    ref = train(model.to("cuda:0"), x, y, 0, x.shape[1], torch.device("cuda:0"))
    port = 29500 + os.getpid() % 1000
    result = mp.get_context("spawn").Manager().dict()
    mp.spawn(worker, args=(port, ref, result), nprocs=WORLD, join=True)
    bad = sum(result.values())
    print(f"torch_dist: torch {torch.__version__}, {WORLD} processes on cuda:0: "
          f"{'PASSED' if bad == 0 else f'{bad} FAILED'}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
