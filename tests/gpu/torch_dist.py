"""PyTorch's NCCL process group on Braid: 2 processes on cuda:0, each call
checked against what it must produce, then 50 DDP steps compared with the
same training in one process. Run with Braid's libnccl.so.2 preloaded
(libtorch_cuda.so finds the wheel's NCCL through its RPATH otherwise) and
NCCL_DEBUG=INFO, so the log shows which library ran:

  LD_PRELOAD=build/lib/libnccl.so.2 NCCL_DEBUG=INFO python3 tests/gpu/torch_dist.py
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
STEPS = 50


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x = torch.randn(STEPS, 2 * 16, 32)
    y = torch.randint(0, 10, (STEPS, 2 * 16))
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
    base = torch.arange(n, dtype=torch.float32, device=dev)
    t = base + rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    bad = check("all_reduce sum", t, 2 * base + 1, bad)
    t = base * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    bad = check("all_reduce avg", t, base * 1.5, bad)
    t = torch.full((1000,), float(rank), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    bad = check("all_reduce max", t, torch.full((1000,), 1.0), bad)
    t = torch.full((4097,), rank, dtype=torch.int64, device=dev) + 7
    dist.broadcast(t, src=1)
    bad = check("broadcast", t, torch.full((4097,), 8, dtype=torch.int64), bad)
    out = torch.empty(2 * 3001, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3001,), float(rank + 1), dtype=torch.bfloat16, device=dev))
    want = torch.cat([torch.full((3001,), 1.0), torch.full((3001,), 2.0)]).to(torch.bfloat16)
    bad = check("all_gather_into_tensor", out, want, bad)
    inp = torch.arange(2 * 5000, dtype=torch.float32, device=dev) * (rank + 1)
    out = torch.empty(5000, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    bad = check("reduce_scatter_tensor", out, torch.arange(rank * 5000, (rank + 1) * 5000, dtype=torch.float32) * 3, bad)
    inp = torch.arange(2 * 777, dtype=torch.int32, device=dev) + 10000 * rank
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * 777, (rank + 1) * 777, dtype=torch.int32) + 10000 * r for r in range(2)])
    bad = check("all_to_all_single", out, want, bad)
    if rank == 0:
        dist.send(torch.arange(12345, dtype=torch.float16, device=dev), dst=1)
        r = torch.empty(999, dtype=torch.int8, device=dev)
        dist.recv(r, src=1)
        bad = check("recv", r, torch.full((999,), 5, dtype=torch.int8), bad)
    else:
        r = torch.empty(12345, dtype=torch.float16, device=dev)
        dist.recv(r, src=0)
        bad = check("recv", r, torch.arange(12345, dtype=torch.float16), bad)
        dist.send(torch.full((999,), 5, dtype=torch.int8, device=dev), dst=0)
    dist.barrier(device_ids=[0])
    torch.cuda.synchronize()
    return bad


def worker(rank, port, ref, result):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    bad = collectives(rank, dev)
    model, x, y = model_and_data()
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[0])
    half = x.shape[1] // 2
    params = train(ddp, x, y, rank * half, (rank + 1) * half, dev)
    diff = (params - ref).abs().max().item()
    print(f"[rank {rank}] DDP {STEPS} steps vs one process: max |diff| {diff:.3g}", flush=True)
    bad += 0 if diff < 1e-5 else 1
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
