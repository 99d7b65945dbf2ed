"""torch.distributed all_reduce and DDP training, backend "braid" against
"gloo" in the same run (perf/torch_compare.sh runs it; docs/torch.md has the
figures), and against three more on request (perf/torch_peers.sh): "braid-op",
braid's all_reduce as a torch op without a Work (braid_torch.all_reduce_), "deepspeed",
DeepSpeed's shared-memory all-reduce for CPU inference
(deepspeed.comm.inference_all_reduce, DS_ACCELERATOR=cpu), and "library",
Braid's own all_reduce_perf on the same ranks and sizes (its in-place
column: torch's all_reduce is in place). Each backend gets NP forked ranks
on this host; rank 0 prints.

all_reduce: DTYPE (float32 or bfloat16) sum, in place on the tensor,
4 KiB .. 256 MiB, the mean time per call over ITERS calls after warm-up
(nccl-tests' definition), busbw = bytes / time * 2(n-1)/n.
DDP: a 784-512-512-10 MLP, SGD, BATCH samples per rank; steps per second,
and the step time without communication (DDP's no_sync) to tell how much
of a step is communication. The backends take turns over ROUNDS rounds and
each figure is the median over them.
"""

import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from free_port import free_port  # noqa: E402  (the repository's tool, not a package)


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4 if s < hi else 2


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def reducer(backend):
    """The call under test: torch's all_reduce, DeepSpeed's inference one, or
    braid's op without a Work (braid_torch.all_reduce_, "braid-op")."""
    if backend == "deepspeed":
        import deepspeed.comm as dcomm
        return lambda x: dcomm.inference_all_reduce(x)
    if backend == "braid-op":
        import braid_torch
        return braid_torch.all_reduce_
    return dist.all_reduce


def bench_allreduce(rank, n, args, backend):
    rows = []
    reduce = reducer(backend)
    dtype = DTYPES[args.dtype]
    for size in sizes(args.min_bytes, args.max_bytes):
        x = torch.ones(size // dtype.itemsize, dtype=dtype)
        # enough calls for about args.seconds per size, within [3, args.iters]
        for _ in range(2):
            reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        reduce(x)
        one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        iters = int(max(3, min(args.iters, args.seconds / max(float(one), 1e-6))))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            reduce(x)
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        t = float(dt)
        busbw = size / t * 2 * (n - 1) / n / 1e9
        want = torch.tensor(math.inf if (iters + 3) * math.log2(n) > 1000 else float(n) ** (iters + 3),
                            dtype=torch.float64).to(dtype)  # inf past the type's range
        ok = bool(torch.all(x == want).item()) if size <= 1 << 20 else True
        rows.append({"bytes": size, "us": t * 1e6, "busbw": busbw, "iters": iters, "ok": ok})
        del x
    return rows


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


def bench_ddp(rank, n, args):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def step(sync):
        opt.zero_grad()
        if sync:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
        else:
            with model.no_sync():
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
        opt.step()

    def timed(sync, steps):
        for _ in range(3):
            step(sync)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(sync)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return float(dt) / steps

    runs = []
    for _ in range(args.ddp_reps):
        runs.append((timed(True, args.steps), timed(False, args.steps)))
    step_s = statistics.median(r[0] for r in runs)
    local_s = statistics.median(r[1] for r in runs)
    params = sum(p.numel() for p in model.parameters())
    # the gradients' all-reduce alone, as DDP sends it (one flat bucket)
    flat = torch.zeros(params)
    for _ in range(3):
        dist.all_reduce(flat)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        dist.all_reduce(flat)
    ar = torch.tensor([(time.perf_counter() - t0) / args.steps], dtype=torch.float64)
    dist.all_reduce(ar, op=dist.ReduceOp.MAX)
    return {"steps_per_s": 1.0 / step_s, "step_ms": step_s * 1e3, "no_sync_step_ms": local_s * 1e3,
            "comm_ms": max(0.0, step_s - local_s) * 1e3, "grad_allreduce_ms": float(ar) * 1e3,
            "params": params, "batch": args.batch}


def init_deepspeed(rank, n, port):
    """DeepSpeed as its CPU users start it: gloo underneath, its shared-memory
    op (built on first use) for inference_all_reduce on one node."""
    os.environ.update({"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(n),
                       "LOCAL_RANK": str(rank), "LOCAL_SIZE": str(n)})
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                               timeout=timedelta(seconds=600))


def rank_main(rank, n, backend, store_path, args, conn):
    torch.set_num_threads(1)
    if backend.startswith("braid"):
        import braid_torch  # noqa: F401
    if backend == "deepspeed":
        init_deepspeed(rank, n, args.port)
    else:
        store = dist.FileStore(store_path, n)
        dist.init_process_group(backend.split("-")[0], store=store, rank=rank, world_size=n,
                                timeout=timedelta(seconds=600))
    out = {}
    if "allreduce" in args.what:
        out["allreduce"] = bench_allreduce(rank, n, args, backend)
    if "ddp" in args.what and backend in ("braid", "gloo"):
        out["ddp"] = bench_ddp(rank, n, args)
    dist.barrier()
    if rank == 0:
        conn.send(out)
    dist.destroy_process_group()


def run_library(args):
    """Braid's all_reduce_perf on the same ranks and sizes (mpirun), its
    in-place column: the library's own time, no torch in between."""
    dt = {"float32": "float", "bfloat16": "bfloat16"}[args.dtype]
    cmd = ["mpirun", "-np", str(args.np), "--bind-to", "none", "--mca", "oob_tcp_if_include",
           "lo", "--allow-run-as-root", "--oversubscribe", os.path.join(args.bin, "all_reduce_perf"),
           "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", "4", "-d", dt, "-o", "sum",
           "-n", str(args.iters), "-w", "20", "-c", "0"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    rows = []
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 13 and f[0].isdigit() and f[2] == dt:
            size, us = int(f[0]), float(f[9])  # in place
            rows.append({"bytes": size, "us": us, "busbw": 0.0, "iters": args.iters, "ok": True})
    if not rows:
        raise SystemExit(f"torch_bench: all_reduce_perf gave nothing:\n{out.stdout}{out.stderr}")
    return {"allreduce": rows}


def run_backend(backend, args):
    if backend == "library":
        return run_library(args)
    args.port = free_port()
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as d:
        parent, child = ctx.Pipe(duplex=False)
        procs = [ctx.Process(target=rank_main,
                             args=(r, args.np, backend, os.path.join(d, "store"), args, child))
                 for r in range(args.np)]
        for p in procs:
            p.start()
        child.close()
        out = parent.recv() if parent.poll(args.timeout) else None
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if out is None or any(p.exitcode for p in procs):
            raise SystemExit(f"torch_bench: {backend} failed (exit codes "
                             f"{[p.exitcode for p in procs]})")
        return out


def median_of(runs, n):
    out = {}
    if "allreduce" in runs[0]:
        rows = []
        for i, r0 in enumerate(runs[0]["allreduce"]):
            us = statistics.median(run["allreduce"][i]["us"] for run in runs)
            rows.append({"bytes": r0["bytes"], "us": us,
                         "busbw": r0["bytes"] / (us * 1e-6) * 2 * (n - 1) / n / 1e9,
                         "ok": all(run["allreduce"][i]["ok"] for run in runs)})
        out["allreduce"] = rows
    if "ddp" in runs[0]:
        d = dict(runs[0]["ddp"])
        for k in ("step_ms", "no_sync_step_ms", "comm_ms", "grad_allreduce_ms"):
            d[k] = statistics.median(run["ddp"][k] for run in runs)
        d["steps_per_s"] = 1e3 / d["step_ms"]
        out["ddp"] = d
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--backends", default="gloo,braid")
    ap.add_argument("--what", default="allreduce,ddp")
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=0.5, help="target time per size")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ddp-reps", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--bin", default="build/bin", help="where all_reduce_perf is (library)")
    args = ap.parse_args()
    results = {"np": args.np, "torch": torch.__version__, "rounds": args.rounds,
               "dtype": args.dtype}
    backends = args.backends.split(",")
    # Rounds alternate the backends, and each figure is the median over rounds: on a shared
    # host the load shifts, and one backend measured after the other would carry the shift.
    runs = {b: [] for b in backends}
    for r in range(args.rounds):
        for b in backends:
            print(f"# round {r + 1}/{args.rounds}: {b}, {args.np} ranks", file=sys.stderr,
                  flush=True)
            runs[b].append(run_backend(b, args))
    for b in backends:
        results[b] = median_of(runs[b], args.np)
        results[b]["runs"] = runs[b]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    report(results, args.backends.split(","))


def report(res, backends):
    if all("allreduce" in res[b] for b in backends):
        print(f"# all_reduce {res.get('dtype', 'float32')} sum, {res['np']} ranks, torch "
              f"{res['torch']}: time per call (us) and busbw (GB/s), median of {res['rounds']} "
              f"alternating rounds")
        hdr = "".join(f"  {b + ' us':>12} {b + ' GB/s':>11}" for b in backends)
        print(f"# {'bytes':>10}{hdr}  {'ratio':>6}")
        rows = {b: {r["bytes"]: r for r in res[b]["allreduce"]} for b in backends}
        for size in sorted(rows[backends[0]]):
            line = f"  {size:>10}"
            for b in backends:
                r = rows[b].get(size)
                line += f"  {r['us']:>12.1f} {r['busbw']:>11.3f}" if r else "  " + " " * 24
            if len(backends) > 1 and all(size in rows[b] for b in backends[:2]):
                line += f"  {rows[backends[1]][size]['us'] / rows[backends[0]][size]['us']:>6.3f}"
            if not all(rows[b][size]["ok"] for b in backends if size in rows[b]):
                line += "  WRONG RESULT"
            print(line)
        if len(backends) > 1:
            print(f"# ratio = {backends[1]} time / {backends[0]} time")
    if all("ddp" in res[b] for b in backends):
        d0 = res[backends[0]]["ddp"]
        print(f"# DDP, 784-512-512-10 MLP ({d0['params']} parameters), SGD, batch {d0['batch']} "
              f"per rank, {res['np']} ranks, median of {res['rounds']} rounds")
        print(f"# {'backend':>8} {'steps/s':>8} {'step ms':>8} {'no_sync ms':>10} "
              f"{'comm ms':>8} {'grad all_reduce ms':>18}")
        for b in backends:
            d = res[b]["ddp"]
            print(f"  {b:>8} {d['steps_per_s']:>8.1f} {d['step_ms']:>8.2f} "
                  f"{d['no_sync_step_ms']:>10.2f} {d['comm_ms']:>8.2f} "
                  f"{d['grad_allreduce_ms']:>18.2f}")


if __name__ == "__main__":
    main()
