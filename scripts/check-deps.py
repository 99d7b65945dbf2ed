#!/usr/bin/env python3
"""The library's own dependency graph, checked (docs/architecture.md, "Layers").

A module is a source file and its header (src/comm/comm.c + src/comm/comm.h). Module A
depends on module B when A's source or header includes B's header, or when
A's object calls (or reads) a symbol that only B's object defines: the
compiler's view and the linker's, so a call through a declaration written
by hand counts too. Three rules, each a failure of `make test`:

  - no dependency climbs: a module in folder F depends only on folders
    F may include from (the Makefile's LAYER_* lists, `make print-layers`);
  - no cycle of more than MAX_CYCLE modules (the strongly connected
    components of the graph);
  - a header declares only functions its own source defines, except the
    interfaces in INTERFACES, each implemented by files the build picks
    (or, for the CPU kernels, split by instruction set) in the folders named.

Usage: scripts/check-deps.py BUILD_DIR [--report]  (after `make lib`)
"""
import os
import re
import subprocess
import sys

MAX_CYCLE = 3
SOURCE_DIRS = ("common", "gpu", "kernels", "algorithms", "transports", "src")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PROTOTYPE = re.compile(r"^(?!static|typedef|extern|#|\s)[A-Za-z_][\w\s\*]*?\b([a-z_][a-z0-9_]*)\s*\(([^;{]*)\)\s*;",
                       re.M)
# Header -> the folders whose files may define what it declares.
INTERFACES = {
    "src/engine/device.h": ("src/cuda", "src/host"),       # the device path, CUDA or none
    "gpu/mem_kind.h": ("gpu/cuda", "gpu/host"),     # memory kinds, with CUDA or host only
    "kernels/kernels.h": ("kernels/cpu",),          # the kernels layer's interface
    "kernels/cpu/kern_dispatch.h": ("kernels/cpu",),  # the ISA variants of reduce*.c
}


def layers():
    """Folder -> the folders it may depend on, from the Makefile."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "print-layers"],
                         capture_output=True, text=True, check=True).stdout
    allowed = {}
    for line in out.splitlines():
        m = re.match(r"layer (\S+): (.*)", line)
        if m:
            allowed[m.group(1)] = set(m.group(2).split())
    return allowed


def modules(build):
    """Module name (path without extension) -> its object, for every
    library object that was built."""
    mods = {}
    for top in SOURCE_DIRS:
        for root, _, files in os.walk(top):
            for f in files:
                if f.endswith(".c"):
                    name = os.path.join(root, f[:-2])
                    obj = os.path.join(build, "obj", name + ".o")
                    if os.path.exists(obj):
                        mods[name] = obj
    return mods


def header_owner(mods):
    """Header path -> module, for headers that have a source beside them;
    headers alone (types, inline helpers) are modules of their own."""
    owner = {}
    for top in SOURCE_DIRS:
        for root, _, files in os.walk(top):
            for f in files:
                if f.endswith(".h"):
                    path = os.path.join(root, f)
                    owner[path] = path[:-2]
    return owner


def resolve(include, here, search):
    for d in [here] + search:
        p = os.path.normpath(os.path.join(d, include))
        if os.path.exists(p):
            return p
    return None


def include_edges(mods, owner, allowed):
    edges = {}
    for name in list(mods) + [h[:-2] for h in owner if h[:-2] not in mods]:
        top = name.split(os.sep)[0]
        search = sorted(allowed.get(top, ()))
        deps = set()
        for ext in (".c", ".h"):
            path = name + ext
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for inc in INCLUDE.findall(text):
                target = resolve(inc, os.path.dirname(path), search)
                if target and target in owner and owner[target] != name:
                    deps.add(owner[target])
        edges[name] = deps
    return edges


def nm(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], capture_output=True, text=True).stdout
    return out.splitlines()


def defined_symbols(mods):
    """Global symbol -> the modules whose objects define it."""
    defined = {}
    for name, obj in mods.items():
        for line in nm(obj, "--defined-only", "-g"):
            parts = line.split()
            if len(parts) == 3:
                defined.setdefault(parts[2], set()).add(name)
    return defined


def symbol_edges(mods, defined):
    edges = {}
    for name, obj in mods.items():
        deps = set()
        for line in nm(obj, "-u"):
            sym = line.split()[-1]
            owners = defined.get(sym, set())
            if len(owners) == 1 and name not in owners:
                deps |= owners
        edges[name] = deps
    return edges


def header_strays(defined):
    """Functions a header declares that a file other than its own defines."""
    strays = []
    for top in SOURCE_DIRS:
        for root, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith(".h"):
                    continue
                path = os.path.join(root, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = re.sub(r"/\*.*?\*/", "", fh.read(), flags=re.S)
                text = re.sub(r",\s*\n\s*", ", ", text)
                homes = INTERFACES.get(path)
                for m in PROTOTYPE.finditer(text):
                    owners = defined.get(m.group(1), set())
                    if not owners or path[:-2] in owners:
                        continue  # defined in its own file, or not built here
                    if homes and all(os.path.dirname(o) in homes for o in owners):
                        continue
                    strays.append("%s declares %s, defined in %s" %
                                  (path, m.group(1), " ".join(sorted(owners))))
    return strays


def sccs(graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    pushed = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build, report = sys.argv[1], "--report" in sys.argv
    allowed = layers()
    mods = modules(build)
    if not mods:
        sys.exit("check-deps: no library objects under %s/obj (make lib first)" % build)
    owner = header_owner(mods)
    graph = include_edges(mods, owner, allowed)
    defined = defined_symbols(mods)
    for name, deps in symbol_edges(mods, defined).items():
        graph.setdefault(name, set()).update(deps)
    bad = []
    for name, deps in sorted(graph.items()):
        top = name.split(os.sep)[0]
        for d in sorted(deps):
            if d.split(os.sep)[0] not in allowed.get(top, ()):
                bad.append("%s -> %s: folder %s may not depend on %s" %
                           (name, d, top, d.split(os.sep)[0]))
    comps = [c for c in sccs(graph) if len(c) > 1]
    big = [c for c in comps if len(c) > MAX_CYCLE]
    nedges = sum(len(d) for d in graph.values())
    if report or bad or big:
        for c in sorted(comps, key=len, reverse=True):
            print("cycle of %d: %s" % (len(c), " ".join(c)))
    for line in bad:
        print("climbs: " + line)
    for c in big:
        print("too long a cycle (%d modules, at most %d): %s" % (len(c), MAX_CYCLE, " ".join(c)))
    strays = header_strays(defined)
    for line in strays:
        print("header: " + line)
    largest = max((len(c) for c in comps), default=1)
    print("check-deps: %d modules, %d dependencies, largest cycle %d, %d climbing, "
          "%d declarations in another file's header" %
          (len(graph), nedges, largest, len(bad), len(strays)))
    stale = doc_figures_stale(graph, len(graph), nedges, largest)
    if stale:
        print(stale)
    sys.exit(1 if bad or big or strays or stale else 0)


# docs/architecture.md gives this script's figures; a build with every
# optional part (CUDA, verbs) checks that it still gives them.
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "architecture.md")
FULL_BUILD = ("src/cuda/cuda_comm", "transports/ib/ib_qp")


def doc_figures_stale(graph, nmods, nedges, largest):
    if not all(m in graph for m in FULL_BUILD):
        print("check-deps: a build without CUDA or verbs: docs/architecture.md's figures "
              "not compared")
        return None
    text = " ".join(open(DOC).read().split())
    m = re.search(r"Today: (\d+) modules, (\d+) dependencies, largest cycle (\d+)", text)
    if m is None:
        return "check-deps: docs/architecture.md has no 'Today: N modules, ...' line"
    if tuple(int(x) for x in m.groups()) != (nmods, nedges, largest):
        return ("check-deps: docs/architecture.md says %s modules, %s dependencies, largest "
                "cycle %s; the build has %d, %d, %d: update its 'Today:' line" %
                (m.group(1), m.group(2), m.group(3), nmods, nedges, largest))
    return None


if __name__ == "__main__":
    main()
