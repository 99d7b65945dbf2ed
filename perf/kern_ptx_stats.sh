#!/bin/bash
# What the fused reduce-copy kernel costs per type, read off the generated
# code (no GPU needed): for each type, the registers ptxas gives a kernel
# that runs kern_body.h on the everyday shape (2 sources, 1 destination, no
# premul or division) and the PTX instructions of its vector loop per
# 16-byte vector out. The probe fixes type and operator so that only that
# path is compiled. Instructions are counted along the path through the
# loop body that loads and stores every vector and calls nothing (the call is
# the out-of-line NaN fix-up, which runs only where a NaN is), the shortest
# such, per vector stored; movs apart too (register renames, mostly free in
# SASS). Also the
# registers of the library's own braid_reduce_copy (all types in one kernel).
#
#   perf/kern_ptx_stats.sh [rev]      rev: a git revision (default: the work tree)
#   OPS="0 1 2 3" ...                 operators (sum prod max min; default 0)
#   ARCHS="80 90" ...                 SM versions (default 80 90)
#   FULL=0 ...                        skip braid_reduce_copy (ptxas takes minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
PTXAS=${PTXAS:-$(dirname "$NVCC")/ptxas}
OPS=${OPS:-0}
ARCHS=${ARCHS:-80 90}
FULL=${FULL:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 1 ]; then
  git archive "$1" kernels | tar -x -C "$tmp"
  echo "kernels at $(git rev-parse --short "$1")"
else
  cp -r kernels "$tmp/"
  echo "kernels in the work tree (HEAD $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- kernels || echo ', modified'))"
fi

names=(int8 uint8 int32 uint32 int64 uint64 half float double bf16 e4m3 e5m2)
{
  echo '#include "cuda/kern_body.h"'
  for op in $OPS; do
    for t in "${!names[@]}"; do
      cat <<EOF
extern "C" __global__ void probe_${names[$t]}_$op(const void* a, const void* b, void* c, uint64_t n) {
  struct kern_dev_task t;
  memset(&t, 0, sizeof t);
  t.type = $t, t.op = $op, t.nsrcs = 2, t.ndsts = 1, t.n = n;
  t.srcs[0] = a, t.srcs[1] = b, t.dsts[0] = c;
  kern_dev_task_run(&t, (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
                    (uint64_t)gridDim.x * blockDim.x);
}
EOF
    done
  done
} >"$tmp/probe.cu"

for arch in $ARCHS; do
  "$NVCC" -O3 -fmad=false -arch=sm_$arch -I"$tmp/kernels" -ptx "$tmp/probe.cu" -o "$tmp/probe_$arch.ptx"
  "$PTXAS" -O3 -arch=sm_$arch -v "$tmp/probe_$arch.ptx" -o /dev/null 2>"$tmp/regs_$arch.txt"
  if [ "$FULL" = 1 ]; then
    "$NVCC" -O3 -fmad=false -arch=sm_$arch -I"$tmp/kernels" -cubin -Xptxas -v \
      "$tmp/kernels/cuda/reduce.cu" -o /dev/null 2>"$tmp/full_$arch.txt"
  fi
done

python3 - "$tmp" "$OPS" "$ARCHS" "${names[*]}" <<'EOF'
import re, sys
tmp, ops, archs, names = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
opname = {"0": "sum", "1": "prod", "2": "max", "3": "min"}

def regs(path):
    out, fn = {}, None
    for line in open(path):
        m = re.search(r"Compiling entry function '(\w+)'", line) or \
            re.search(r"Function properties for (\w+)", line)
        if m: fn = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and fn: out[fn] = int(m.group(1))
    return out

def functions(ptx):
    out, name, body = {}, None, []
    for line in open(ptx):
        m = re.match(r"\.visible \.entry (\w+)\(", line)
        if m: name, body = m.group(1), []
        elif name:
            if line.startswith("}"):
                out[name], name = body, None
            else:
                body.append(line.strip())
    return out

LABEL = re.compile(r"^(\$\w+):$")
BRA = re.compile(r"^(@!?%\w+ )?bra(\.uni)?\s+(\$\w+);")

def is_insn(s):
    return s and not s.startswith(("//", ".", "{", "}", "$")) and s.endswith(";")

def blocks_of(body):
    """Basic blocks: instructions, and successors as block numbers."""
    blocks, cur = [], None
    for s in body:
        if LABEL.match(s) or cur is None:
            cur = {"labels": [], "insns": []}
            blocks.append(cur)
        if LABEL.match(s):
            cur["labels"].append(LABEL.match(s).group(1))
        elif is_insn(s):
            cur["insns"].append(s)
            if BRA.match(s) or s.startswith("ret"):
                cur = None
    where = {l: k for k, b in enumerate(blocks) for l in b["labels"]}
    for k, b in enumerate(blocks):
        last = b["insns"][-1] if b["insns"] else ""
        m, b["succ"] = BRA.match(last), []
        if m:
            b["succ"].append(where[m.group(3)])
        if (not m or m.group(1)) and not last.startswith("ret") and k + 1 < len(blocks):
            b["succ"].append(k + 1)
    return blocks

def per_vector(body):
    """PTX instructions per 16-byte vector stored, on one pass through the
    loop with the most 16-byte loads (the pair loop, or the vector loop):
    the path that stores and loads the most vectors, enters no block that
    calls (the NaN fix-up) and among those is the shortest (no fix-up
    branch taken); an inner loop (over sources or destinations) counts
    once. Returns (all, without mov)."""
    blocks = blocks_of(body)
    pred = {k: [] for k in range(len(blocks))}
    for k, b in enumerate(blocks):
        for n in b["succ"]: pred[n].append(k)
    def count(b, what):
        return sum(1 for x in b["insns"] if re.match(r"(@\S+ )?" + what, x))
    best = None
    for t, b in enumerate(blocks):
        for h in b["succ"]:
            if h > t: continue  # not a back edge
            loop, todo = {h, t}, [t] if t != h else []  # what reaches t without h
            while todo:
                for p_ in pred[todo.pop()]:
                    if p_ not in loop: loop.add(p_), todo.append(p_)
            loads = sum(count(blocks[k], r"ld(\.global)?(\.nc)?\.v[24]") for k in loop)
            if best is None or loads > best[0]: best = (loads, h, t, loop)
    if best is None: return None
    _, head, tail, loop = best
    memo = {}
    def best_path(k):  # (stores, loads, insns, non-mov insns) from block k to the back edge
        if k in memo: return memo[k]
        memo[k] = None  # an inner loop's back edge: one pass
        b, res = blocks[k], None
        if not any(x.startswith("call") for x in b["insns"]):
            own = (count(b, r"st(\.global)?\.v[24]"), count(b, r"ld(\.global)?(\.nc)?\.v[24]"),
                   len(b["insns"]), sum(1 for x in b["insns"] if not x.startswith("mov.")))
            if k == tail and head in b["succ"]: res = own
            for n in b["succ"]:
                if n not in loop or n == head: continue
                r = best_path(n)
                if r: r = tuple(a + c for a, c in zip(own, r))
                if r and (res is None or (r[0], r[1], -r[2]) > (res[0], res[1], -res[2])): res = r
        memo[k] = res
        return res
    sys.setrecursionlimit(100000)
    r = best_path(head)
    if not r or not r[0]: return None
    return r[2] / r[0], r[3] / r[0]

tables = {a: (regs(f"{tmp}/regs_{a}.txt"), functions(f"{tmp}/probe_{a}.ptx")) for a in archs}
for op in ops:
    print(f"\n{opname[op]}, 2 sources -> 1 destination: registers / PTX instructions per "
          "16-byte vector (without mov)")
    print("| type | " + " | ".join(f"sm_{a} regs | sm_{a} insn/vec" for a in archs) + " |")
    print("|---|" + "---|---|" * len(archs))
    for n in names:
        fn, cells = f"probe_{n}_{op}", []
        for a in archs:
            r, f = tables[a]
            v = per_vector(f[fn]) if fn in f else None
            cells += [str(r.get(fn, "?")), "?" if v is None else f"{v[0]:.1f} ({v[1]:.1f})"]
        print(f"| {n} | " + " | ".join(cells) + " |")
for a in archs:
    try:
        r = regs(f"{tmp}/full_{a}.txt")
        print(f"braid_reduce_copy sm_{a}: {r.get('braid_reduce_copy', '?')} registers")
    except FileNotFoundError:
        pass
EOF
