"""Plot perf/torch_bench.py's JSON: all_reduce time and bus bandwidth by
size, and DDP steps per second, one line or bar per backend."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    res = json.load(open(src))
    backends = [b for b in ("gloo", "braid") if b in res]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw={"width_ratios": [3, 3, 1.6]})
    for b in backends:
        rows = res[b].get("allreduce", [])
        x = [r["bytes"] for r in rows]
        ax[0].plot(x, [r["us"] for r in rows], marker="o", ms=3, label=b)
        ax[1].plot(x, [r["busbw"] for r in rows], marker="o", ms=3, label=b)
    for a, title, unit in ((ax[0], "all_reduce time per call", "us"),
                           (ax[1], "all_reduce bus bandwidth", "GB/s")):
        a.set_xscale("log", base=2)
        a.set_xlabel("bytes (float32)")
        a.set_ylabel(unit)
        a.set_title(title)
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    ax[0].set_yscale("log")
    steps = [res[b]["ddp"]["steps_per_s"] for b in backends if "ddp" in res[b]]
    if len(steps) == len(backends):
        ax[2].bar(backends, steps, color=["C0", "C1"][: len(backends)])
        ax[2].set_title("DDP steps/s (MLP)")
        for i, v in enumerate(steps):
            ax[2].text(i, v, f"{v:.0f}", ha="center", va="bottom")
    fig.suptitle(f"torch.distributed {res['torch']}, {res['np']} ranks on one host")
    fig.tight_layout()
    fig.savefig(dst, dpi=80)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
