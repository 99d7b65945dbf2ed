#!/usr/bin/env python3
"""The library's own all-reduce against the same call through torch, in the
same processes, on the same group and tensor, measured in alternating short
blocks (issue 49, docs/torch.md).

A comparison between separate jobs (perf/torch_peers.sh: all_reduce_perf,
then a torch job) is at the mercy of the machine between them: on the
shared 2-core VM the speed of a 2-rank 1 MiB all-reduce flips between about
45 and 140 us every few seconds, within one run of all_reduce_perf. Here
each block is BLOCK_MS long, the three ways take turns (their order
rotating), and each figure is the median of PAIRS blocks; the ratio column
is the median over the turns of the library's time over torch's in the
same turn, so a turn the machine slowed counts for both sides.

The ways: "library", braid_torch._library_loop (ncclAllReduce back to back
in C++, one unit); "dist", dist.all_reduce; "op", braid_torch.all_reduce_
(a torch op with no Work); with --deepspeed, "deepspeed", DeepSpeed's
shared-memory all-reduce for CPU inference (deepspeed.comm.
inference_all_reduce, DS_ACCELERATOR=cpu), its ranks started by
deepspeed.init_distributed on braid. Each block's time is the slowest
rank's.

With --evict BYTES the ways are instead: "lib1", _library_loop(x, 1)
called once per call from Python; "lib1+zero", the same with another
tensor of BYTES zeroed after each call (what any work between two calls
does to the caches); "zero", the zeroing alone. The call's own slowdown
from the eviction is lib1+zero - zero - lib1.

Usage: perf/torch_gap.py [--np 2] [--dtype float32] [--min-bytes 4096]
       [--max-bytes 67108864] [--pairs 15] [--block-ms 20] [--deepspeed]
       [--evict BYTES]
(the braid_torch venv's python; forks NP ranks on this host)
"""
import argparse
import multiprocessing
import os
import statistics
import sys
import time

import braid_torch
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from free_port import free_port  # noqa: E402  (the repository's tool, not a package)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4


def slowest(seconds):
    """The largest of every rank's figure (all ranks call this together)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def loop(f, x, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        f(x)
    return (time.perf_counter() - t0) / iters


def evict_ways(args):
    y = torch.ones(args.evict // 4)

    def lib1(x, k):
        t0 = time.perf_counter()
        for _ in range(k):
            braid_torch._library_loop(x, 1)
        return (time.perf_counter() - t0) / k

    def lib1_zero(x, k):
        t0 = time.perf_counter()
        for _ in range(k):
            braid_torch._library_loop(x, 1)
            y.zero_()
        return (time.perf_counter() - t0) / k

    return {"lib1": lib1, "lib1+zero": lib1_zero, "zero": lambda x, k: loop(lambda _: y.zero_(), x, k)}


def ways(args):
    if args.evict:
        return evict_ways(args)
    w = {
        "library": lambda x, k: braid_torch._library_loop(x, k),
        "dist": lambda x, k: loop(dist.all_reduce, x, k),
        "op": lambda x, k: loop(braid_torch.all_reduce_, x, k),
    }
    if args.deepspeed:
        import deepspeed.comm as dcomm
        w["deepspeed"] = lambda x, k: loop(dcomm.inference_all_reduce, x, k)
    return w


def init(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                      RANK=str(rank), WORLD_SIZE=str(args.np), LOCAL_RANK=str(rank),
                      LOCAL_SIZE=str(args.np))
    torch.set_num_threads(1)
    if not args.deepspeed:
        dist.init_process_group("braid", rank=rank, world_size=args.np)
        return
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    deepspeed.init_distributed(dist_backend="braid", auto_mpi_discovery=False)


def measure(x, args):
    """Per way, the block times (s per call) of every turn."""
    w = ways(args)
    for f in w.values():  # warm up, and connect
        f(x, 3)
    one = slowest(w[next(iter(w))](x, 20))
    iters = max(3, min(100000, int(args.block_ms / 1e3 / max(one, 1e-7))))
    times = {k: [] for k in w}
    names = list(w)
    for p in range(args.pairs):
        for k in names[p % len(names):] + names[:p % len(names)]:
            dist.barrier()
            times[k].append(slowest(w[k](x, iters)))
    return iters, times


def rank_main(rank, args, port, out):
    init(rank, args, port)
    dtype = DTYPES[args.dtype]
    rows = []
    if args.evict:
        x = torch.ones(args.min_bytes // dtype.itemsize, dtype=dtype)
        iters, t = measure(x, args)
        if rank == 0:
            out.put({k: statistics.median(v) for k, v in t.items()})
        dist.destroy_process_group()
        return
    for size in sizes(args.min_bytes, args.max_bytes):
        x = torch.ones(size // dtype.itemsize, dtype=dtype)
        iters, t = measure(x, args)
        ratio = statistics.median(a / b for a, b in zip(t["library"], t["dist"]))
        ratio_op = statistics.median(a / b for a, b in zip(t["library"], t["op"]))
        ratio_ds = ((statistics.median(a / b for a, b in zip(t["deepspeed"], t["dist"])),
                     statistics.median(a / b for a, b in zip(t["deepspeed"], t["op"])))
                    if "deepspeed" in t else None)
        rows.append((size, iters, {k: statistics.median(v) for k, v in t.items()}, ratio,
                     ratio_op, min(a / b for a, b in zip(t["library"], t["dist"])),
                     max(a / b for a, b in zip(t["library"], t["dist"])), ratio_ds))
        del x
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--block-ms", type=float, default=20.0)
    ap.add_argument("--deepspeed", action="store_true", help="DeepSpeed's all-reduce beside")
    ap.add_argument("--evict", type=int, default=0,
                    help="time a MIN_BYTES call with BYTES of another tensor zeroed between")
    args = ap.parse_args()
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, port, out)) for r in range(args.np)]
    for p in procs:
        p.start()
    rows = out.get()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit("torch_gap: a rank failed")
    if args.evict:
        m = {k: v * 1e6 for k, v in rows.items()}
        print(f"# {args.np} ranks, {args.min_bytes} bytes {args.dtype}, {args.evict} bytes zeroed "
              f"between calls: us per call, medians of {args.pairs} turns")
        print(f"lib1 {m['lib1']:.1f}  lib1+zero {m['lib1+zero']:.1f}  zero {m['zero']:.1f}  "
              f"eviction's cost to the call {m['lib1+zero'] - m['zero'] - m['lib1']:.1f}")
        return
    n = args.np
    print(f"# all_reduce {args.dtype} sum, {n} ranks, torch {torch.__version__}: us per call "
          f"(the slowest rank's), medians of {args.pairs} turns of {args.block_ms:g} ms blocks; "
          "busbw ratio = library time / torch time in the same turn (median, min-max)")
    ds = args.deepspeed
    print(f"# {'bytes':>10} {'iters':>6} {'library us':>11} {'dist us':>9} {'op us':>9} "
          f"{'lib GB/s':>9} {'dist/lib':>9} {'op/lib':>8}  dist/lib turns" +
          ("  deepspeed us  ds/dist    ds/op" if ds else ""))
    for size, iters, med, ratio, ratio_op, lo, hi, ratio_ds in rows:
        busbw = size / med["library"] * 2 * (n - 1) / n / 1e9
        print(f"{size:12d} {iters:6d} {med['library'] * 1e6:11.1f} {med['dist'] * 1e6:9.1f} "
              f"{med['op'] * 1e6:9.1f} {busbw:9.3f} {ratio:9.3f} {ratio_op:8.3f}  "
              f"{lo:.3f}-{hi:.3f}" +
              (f"  {med['deepspeed'] * 1e6:12.1f} {ratio_ds[0]:8.3f} {ratio_ds[1]:8.3f}"
               if ds else ""))
    if ds:
        print("# ds/dist, ds/op = DeepSpeed's time over dist.all_reduce's, over the op's, in the "
              "same turn (median): above 1, braid is ahead")


if __name__ == "__main__":
    main()
