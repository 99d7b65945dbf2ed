#!/usr/bin/env python3
"""braid-sim against what runs here: perf/bench_cluster.sh's measurements on the emulated
cluster (results.csv) beside braid-sim's prediction for the same layout, algorithm and size
(docs/simulator.md, "Calibration"). braid-sim plays each size 16 times back to back, as the
benchmark's loop runs it, every rank in full. Prints, per layout, a markdown table of measured
and predicted time and the error, then per layout and algorithm the worst error and how many
sizes are within the bound; exits 1 if any size is outside it.

Usage: perf/sim_calibrate.py BUILD RESULTS_CSV [--bound 0.15] [--config 1gbit]
                             [--fit name=v1,v2,...]... [name=value ...]
The link rate nic_gbps defaults to the iperf3 minimum the run measured ("min" row). Each --fit
tries every value of a figure (all combinations of all --fit's) and keeps the combination with
the fewest sizes outside the bound, then the smallest mean error; it is printed first.
"""
import concurrent.futures
import csv
import itertools
import os
import statistics
import subprocess
import sys
from collections import defaultdict

SYSTEMS = ("Ring", "Tree", "RecDoubling", "Hier")


def measured(path, config):
    """{(layout, system): {bytes: median time_us}}, and the iperf3 line rate in Gbit/s."""
    runs = defaultdict(lambda: defaultdict(list))
    line_gbps = None
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["config"] != config:
                continue
            if row["system"] == "iperf3" and row["sweep"] == "min":
                line_gbps = float(row["busbw"]) * 8
            elif row["layout"] != "link" and row["time_us"] and row["system"] in SYSTEMS:
                runs[(row["layout"], row["system"])][int(row["bytes"])].append(float(row["time_us"]))
    return {k: {b: statistics.median_low(v) for b, v in d.items()} for k, d in runs.items()}, line_gbps


def predicted(build, layout, system, sizes, settings):
    """{bytes: time_us} from braid-sim, every rank played, 16 calls back to back."""
    nodes, per_node = (int(x) for x in layout.split("x"))
    cmd = [f"{build}/bin/braid-sim", "--ranks", str(nodes * per_node), "--per-node", str(per_node),
           "--bytes", f"{min(sizes)}:{max(sizes)}", "--factor", "2", "--algo", system, "--full",
           "--exact", "--csv", "--repeat", "16"] + settings
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        f = line.split(",")
        if len(f) >= 9 and f[4] == system and f[0].isdigit():
            times[int(f[2])] = float(f[5])
    return times


def layouts_of(data):
    return sorted({k[0] for k in data}, key=lambda l: [int(x) for x in l.split("x")])


def predict_all(build, data, settings):
    """{(layout, system): predicted()} for every measured pair, braid-sim running on every
    core at once (each run is one process playing one layout and algorithm)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        jobs = {key: pool.submit(predicted, build, key[0], key[1], list(meas), settings)
                for key, meas in data.items() if meas}
        return {key: job.result() for key, job in jobs.items()}


def evaluate(build, data, settings, bound):
    """(sizes outside the bound, mean |error|, report lines)."""
    lines, outside, errors = [], 0, []
    sims = predict_all(build, data, settings)
    for layout in layouts_of(data):
        lines += [f"\n## {layout}\n", "| bytes | " + " | ".join(
            f"{s} meas us | sim us | err" for s in SYSTEMS) + " |", "|---" * 13 + "|"]
        rows, summary = defaultdict(dict), []
        for system in SYSTEMS:
            meas = data.get((layout, system), {})
            if not meas:
                continue
            sim = sims[(layout, system)]
            errs = []
            for b, t in meas.items():
                p = sim.get(b)
                err = (p - t) / t if p else float("inf")
                rows[b][system] = (t, p, err)
                errs.append(abs(err))
            within = sum(e <= bound for e in errs)
            summary.append(f"{layout} {system}: worst {max(errs):.0%}, {within}/{len(errs)} sizes "
                           f"within {bound:.0%}")
            outside += len(errs) - within
            errors += errs
        for b in sorted(rows):
            cells = []
            for system in SYSTEMS:
                t, p, err = rows[b].get(system, (None, None, None))
                cells.append("- | - | -" if t is None else f"{t:.1f} | {p:.1f} | {err:+.0%}")
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        lines += [""] + summary
    mean = sum(errors) / len(errors) if errors else 0.0
    lines.append(f"\n# {outside} of {len(errors)} sizes outside {bound:.0%}; mean error {mean:.1%}")
    return outside, mean, lines


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    build, path, bound, config, settings, fits = args[0], args[1], 0.15, "1gbit", [], []
    rest = iter(args[2:])
    for a in rest:
        if a == "--bound":
            bound = float(next(rest))
        elif a == "--config":
            config = next(rest)
        elif a == "--fit":
            name, values = next(rest).split("=", 1)
            fits.append([f"{name}={v}" for v in values.split(",")])
        else:
            settings.append(a)
    data, line_gbps = measured(path, config)
    if line_gbps and not any(s.startswith("nic_gbps=") for s in settings):
        settings.append(f"nic_gbps={line_gbps:.3f}")
    best = None
    for combo in itertools.product(*fits):
        outside, mean, lines = evaluate(build, data, settings + list(combo), bound)
        if best is None or (outside, mean) < best[:2]:
            best = (outside, mean, lines, list(combo))
    outside, mean, lines, combo = best
    print(f"# braid-sim against {path} ({config}); cluster: {' '.join(settings + combo)}; "
          f"bound {bound:.0%}")
    print("\n".join(lines))
    sys.exit(1 if outside else 0)


if __name__ == "__main__":
    main()
