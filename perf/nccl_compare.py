#!/usr/bin/env python3
"""Braid's modelled all-reduce at 1k-24k ranks beside NCCL's published scaling (docs/simulator.md,
"Beside NCCL at scale"): braid-sim plays Braid's own schedules on a Summit-like cluster, and the
same network figures go through NCCL's own latency model (its src/graph/tuning.cc, as of
v2.30.7-1: base and per-hop latencies, ring and tree step counts; formulas restated below, no code
taken). Prints a markdown table per size.

    perf/nccl_compare.py BUILD [N ...]     (default N: 1536 6144 24576; 6 ranks per node)

The cluster (Summit's shape: 6 GPUs and 2 EDR NICs per node, a non-blocking fat tree) is given to
braid-sim as figures; NCCL's model gets the same per-hop latencies: its NET hardware latency for
the LL protocol (the small-size one) is Braid's net_lat_us + msg_us, its intra-node one Braid's
intra_lat_us + intra_msg_us.
"""
import math
import subprocess
import sys

PER_NODE = 6
CLUSTER = {
    "nics": 2,
    "nic_gbps": 100,  # EDR InfiniBand
    "intra_gbps": 400,  # NVLink 2.0, 50 GB/s
    "intra_lat_us": 0.1,
    "intra_msg_us": 0.5,  # NCCL: NVLink LL hop 0.6 us
    "net_lat_us": 0.7,
    "msg_us": 2.0,  # NCCL: NET ring LL hop 2.7 us
    "reduce_gbps": 2000,  # a GPU reduces at memory speed: never the bound here
    "copy_gbps": 2000,
    "tune_links": 1,  # the tuner prices these links, as a tune file written for them would
}

# NCCL's tuning model, v2.30.7-1 src/graph/tuning.cc, LL protocol (microseconds).
NCCL_BASE = {"Ring": 6.6, "Tree": 6.8}
NCCL_NET_HOP = {"Ring": 2.7, "Tree": 5.0}
NCCL_NVLINK_HOP = {"Ring": 0.6, "Tree": 0.6}
NCCL_NET_OVERHEAD = 1.0  # per step, Intel/unknown CPUs


def nccl_latency(algo, nranks, nnodes):
    """The latency term NCCL's tuner charges an all-reduce (its formulas, restated)."""
    intra, inter = NCCL_NVLINK_HOP[algo], NCCL_NET_HOP[algo]
    if algo == "Ring":
        steps, inter_steps = 2 * (nranks - 1), 2 * (nnodes - 1)
        intra = max(intra, NCCL_NET_OVERHEAD)
        return NCCL_BASE[algo] + (steps - inter_steps) * intra + inter_steps * inter
    levels = int(math.log2(nnodes))  # log2i: the floor
    return NCCL_BASE[algo] + 2 * ((nranks // nnodes - 1) * intra + levels * inter)


def braid(build, nranks, nbytes, coll="allreduce", per_node=PER_NODE):
    """braid-sim's rows for one point: {algo: (us, busbw)}, and the tuner's pick."""
    cmd = [f"{build}/bin/braid-sim", "--ranks", str(nranks), "--per-node", str(per_node),
           "--coll", coll, "--bytes", str(nbytes), "--csv"]
    cmd += [f"{k}={v}" for k, v in CLUSTER.items()]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows, pick = {}, None
    for line in out.splitlines():
        f = line.split(",")
        if line.startswith("#") or f[0] == "ranks":
            continue
        if f[7] != "too_big":  # braid-sim could not answer: too many steps, no line
            rows[f[4]] = (float(f[5]), float(f[6]))
        pick = f[8]
    return rows, pick


def cell(rows, algo, i, fmt):
    return fmt.format(rows[algo][i]) if algo in rows else "too big"


ALGOS = ("Ring", "Tree", "RecDoubling", "Hier", "Pairwise")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build = sys.argv[1]
    ns = [int(a) for a in sys.argv[2:]] or [1536, 6144, 24576]
    print("Cluster: " + " ".join(f"{k}={v}" for k, v in CLUSTER.items()) +
          f", {PER_NODE} ranks per node.\n")
    print("8 B all-reduce, microseconds: NCCL's model (LL protocol) and braid-sim\n")
    print("| ranks | nodes | NCCL ring | NCCL tree | ring/tree | Braid Ring | Braid Tree | "
          "Braid RecDoubling | Braid Hier | Braid Pairwise | Braid ring/best | tuner |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in ns:
        nodes = n // PER_NODE
        ring, tree = nccl_latency("Ring", n, nodes), nccl_latency("Tree", n, nodes)
        rows, pick = braid(build, n, 8)
        best = min(us for us, _ in rows.values())
        cells = " | ".join(cell(rows, a, 0, "{:.1f}") for a in ALGOS)
        print(f"| {n} | {nodes} | {ring:.1f} | {tree:.1f} | {ring / tree:.0f}x | {cells} | "
              f"{rows['Ring'][0] / best:.0f}x | {pick} |")
    print("\n1 GiB all-reduce, bus bandwidth GB/s (a NIC's line rate: "
          f"{CLUSTER['nic_gbps'] / 8:.2f} GB/s; a ring crosses each node once)\n")
    print("| ranks | Braid Ring | Braid Tree | Braid RecDoubling | Braid Hier | Braid Pairwise "
          "| tuner |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for n in ns:
        rows, pick = braid(build, n, 1 << 30)
        cells = " | ".join(cell(rows, a, 1, "{:.2f}") for a in ALGOS)
        print(f"| {n} | {cells} | {pick} |")
    log_step_allgather(build, ns)


def log_step_allgather(build, ns):
    """What Braid lacks: an all-gather in log2(N) network steps (NCCL's PAT, Bruck's), at one
    rank a node, priced with the same hop cost and line rate (a bound, not a Braid schedule)."""
    hop = CLUSTER["net_lat_us"] + CLUSTER["msg_us"]
    rate = CLUSTER["nic_gbps"] * 1e3 / 8  # bytes per us
    print("\nAll-gather at one rank a node (PAT's case), microseconds: Braid's best (braid-sim) "
          f"and a log-step all-gather, ceil(log2 N) hops of {hop:.1f} us plus (N-1)/N of the "
          "output at the line rate\n")
    print("| ranks | per rank | Braid best | algorithm | log-step | Braid / log-step |")
    print("|---:|---:|---:|---|---:|---:|")
    for n in ns:
        for per in (8, 4096, 1 << 20):
            rows, _ = braid(build, n, per * n, "allgather", 1)
            algo, (us, _) = min(rows.items(), key=lambda kv: kv[1][0])
            bound = math.ceil(math.log2(n)) * hop + (n - 1) * per / rate
            print(f"| {n} | {per} | {us:.1f} | {algo} | {bound:.1f} | {us / bound:.1f}x |")


if __name__ == "__main__":
    main()
