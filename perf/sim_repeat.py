#!/usr/bin/env python3
"""How well two measuring runs of perf/bench_cluster.sh agree with each other: the floor
under any calibration of braid-sim against them (docs/simulator.md, "Calibration").

For every layout, algorithm and size both runs measured (each run's median over its
repetitions, as perf/sim_calibrate.py takes it), the ratio of the slower to the faster.
Where it exceeds (1 + bound) / (1 - bound), 1.35 for 15%, no single prediction can be
within the bound of both runs. Prints one line per layout and algorithm, then the totals,
and (--sizes) every size further apart than the bound.

Usage: perf/sim_repeat.py RUN1_CSV RUN2_CSV [--bound 0.15] [--config 1gbit] [--sizes]
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_calibrate import SYSTEMS, layouts_of, measured  # noqa: E402

SMALL = 16384  # the latency-bound sizes: up to 16 KiB


def args():
    a = {"bound": 0.15, "config": "1gbit", "sizes": False, "runs": []}
    it = iter(sys.argv[1:])
    for x in it:
        if x == "--bound":
            a["bound"] = float(next(it))
        elif x == "--config":
            a["config"] = next(it)
        elif x == "--sizes":
            a["sizes"] = True
        elif x.startswith("-"):
            sys.exit(__doc__)
        else:
            a["runs"].append(x)
    if len(a["runs"]) != 2:
        sys.exit(__doc__)
    return a


def main():
    a = args()
    one, _ = measured(a["runs"][0], a["config"])
    two, _ = measured(a["runs"][1], a["config"])
    apart, split = 1 + a["bound"], (1 + a["bound"]) / (1 - a["bound"])
    total = defaultdict(int)
    print(f"# {os.path.basename(a['runs'][0])} against {os.path.basename(a['runs'][1])}: "
          f"slower / faster run of each size; > {apart:.2f}: apart by more than the bound; "
          f"> {split:.2f}: no one figure within {a['bound']:.0%} of both")
    print("# layout algorithm: sizes, > %.2f (of them <= 16 KiB), > %.2f, worst" % (apart, split))
    for layout in layouts_of(one):
        for system in SYSTEMS:
            m1, m2 = one.get((layout, system), {}), two.get((layout, system), {})
            sizes = sorted(set(m1) & set(m2))
            if not sizes:
                continue
            ratio = {b: max(m1[b], m2[b]) / min(m1[b], m2[b]) for b in sizes}
            far = [b for b in sizes if ratio[b] > apart]
            worst = max(sizes, key=lambda b: ratio[b])
            row = {"sizes": len(sizes), "far": len(far),
                   "far_small": sum(1 for b in far if b <= SMALL),
                   "small": sum(1 for b in sizes if b <= SMALL),
                   "split": sum(1 for b in sizes if ratio[b] > split)}
            for k, v in row.items():
                total[k] += v
            print(f"{layout:>5} {system:<11}: {row['sizes']:3d}, {row['far']:3d} "
                  f"({row['far_small']}), {row['split']:3d}, {ratio[worst]:.2f}x at {worst} B")
            if a["sizes"]:
                for b in far:
                    print(f"      {b:>10} B  {m1[b]:12.1f} us  {m2[b]:12.1f} us  {ratio[b]:.2f}x")
    print(f"total: {total['sizes']} sizes; {total['far']} apart by more than {a['bound']:.0%} "
          f"({total['far_small']} of the {total['small']} up to 16 KiB); {total['split']} by "
          f"more than {split:.2f}x")


if __name__ == "__main__":
    main()
