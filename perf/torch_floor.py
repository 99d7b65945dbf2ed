#!/usr/bin/env python3
"""What a call costs through torch on one rank, where no peer waits: the
floor under every figure of perf/torch_peers.sh (docs/torch.md, issue 49).

Times, per call of a 1024-float tensor, alternating ROUNDS rounds:
dist.all_reduce on braid, the process group's own allreduce and wait (the
same call without torch's Python wrapper around it), the same with torch's
flight-recorder hook put back (what torch attaches to a backend it does not
know to record itself),
braid_torch.all_reduce_, its torch op called directly, and an in-place
x.add_(0) (the cost of any torch op). Prints the median and every round.

Usage: perf/torch_floor.py [--calls N] [--rounds R]   (the braid_torch venv's python)
"""
import argparse
import shutil
import statistics
import tempfile
import time

import braid_torch
import torch
import torch.distributed as dist


def per_call_us(f, calls):
    for _ in range(calls // 20):
        f()
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    store = tempfile.mkdtemp(prefix="braid-floor-")
    c10d = dist.distributed_c10d
    dist.init_process_group("braid", init_method=f"file://{store}/world", rank=0, world_size=1)
    # a second group of one rank with torch's hook on it, as before braid declared itself
    c10d._FR_SELF_RECORDING_BACKENDS.discard("braid")
    hooked = dist.new_group([0])
    c10d._FR_SELF_RECORDING_BACKENDS.add("braid")
    assert hooked in c10d._world.pg_flight_recorder_hooks
    x = torch.ones(1024)
    op, name = torch.ops.braid.all_reduce_, dist.group.WORLD.group_name
    world = dist.group.WORLD  # its C++ entry: dist.all_reduce less torch's Python around it
    cases = {
        "dist.all_reduce": lambda: dist.all_reduce(x),
        "WORLD.allreduce([x]).wait()": lambda: world.allreduce([x]).wait(),
        "dist.all_reduce, torch's hook": lambda: dist.all_reduce(x, group=hooked),
        "braid_torch.all_reduce_": lambda: braid_torch.all_reduce_(x),
        "torch.ops.braid.all_reduce_": lambda: op(x, "sum", name),
        "x.add_(0)": lambda: x.add_(0),
    }
    runs = {k: [] for k in cases}
    for _ in range(args.rounds):
        for k, f in cases.items():
            runs[k].append(per_call_us(f, args.calls))
    print(f"# 1 rank, 1024 floats, torch {torch.__version__}: us per call, median of "
          f"{args.rounds} alternating rounds of {args.calls} calls, then every round")
    for k, v in runs.items():
        print(f"{k:32s} {statistics.median(v):7.2f}   " + " ".join(f"{u:.2f}" for u in v))
    dist.destroy_process_group()
    shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
