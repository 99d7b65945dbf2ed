#!/usr/bin/env python3
"""Which of the library's files one call passes, from a callgrind profile.

Run a program under `valgrind --tool=callgrind --toggle-collect=FUNC` and
give the output file here: every call made inside FUNC, caller file ->
callee file, is read from the profile; the library's files (common, gpu,
kernels, algorithms, transports, src) are listed with the layer each is in,
and every call from a lower layer into a higher one (a callback, or a
helper that lives too high) is a climb. Rooms are the folders those files
lie in; a switch is a call from one room's file to another room's. perf/call_walk.sh runs it for an
all-reduce on host buffers and on device buffers (the simulated driver).

Usage: perf/call_walk.py CALLGRIND_OUT REPO_ROOT
Also prints the rooms and switches as the folders were before src/ took its own (5643af5:
src/ one room but src/cuda and src/host; gpu/cuda, which came from src/cuda, as src/cuda),
so that walks before and after that split compare on one partition.
"""
import os
import re
import sys

# Bottom to top, as docs/architecture.md draws them.
LAYER = {"common": 0, "kernels": 1, "algorithms": 1, "gpu": 2, "transports": 3, "src": 4}


def module(path, root):
    """repo-relative module name (no extension) of a source path, or None."""
    if not path.startswith(root):
        return None
    rel = os.path.relpath(path, root)
    top = rel.split(os.sep)[0]
    if top not in LAYER:
        return None
    return os.path.splitext(rel)[0]


def edges(profile, root):
    names = {"fl": {}, "fn": {}}
    out = set()
    cur_file = None
    call_file = None
    with open(profile, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^(fl|fi|fe|fn|cfl|cfi|cfn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
            if not m:
                continue
            key, ident, name = m.groups()
            table = names["fn" if key in ("fn", "cfn") else "fl"]
            if name is not None:
                table[ident] = name
            value = table.get(ident)
            if key in ("fl", "fi", "fe"):
                cur_file = value
                if key == "fl":
                    call_file = None
            elif key in ("cfl", "cfi"):
                call_file = value
            elif key == "cfn":
                a = module(cur_file or "", root)
                b = module(call_file or cur_file or "", root)
                if a and b and a != b:
                    out.add((a, b))
                call_file = None
    return out


def room_before_split(path):
    """The folder a file's room was before src/ took folders of its own."""
    d = os.path.dirname(path)
    if d == os.path.join("gpu", "cuda"):
        return os.path.join("src", "cuda")
    if d.startswith("src" + os.sep) and d not in (os.path.join("src", "cuda"),
                                                  os.path.join("src", "host")):
        return "src"
    return d


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[2]) + os.sep
    calls = edges(sys.argv[1], root)
    files = sorted({x for e in calls for x in e})
    climbs = sorted((a, b) for a, b in calls
                    if LAYER[a.split(os.sep)[0]] < LAYER[b.split(os.sep)[0]])
    for f in files:
        print("file  %-12s %s" % (f.split(os.sep)[0], f))
    for a, b in climbs:
        print("climb %s -> %s" % (a, b))
    # rooms: the folders the files lie in (src/engine, transports/tcp);
    # switches: calls from a file in one room to a file in another
    rooms = sorted({os.path.dirname(f) for f in files})
    switches = sum(1 for a, b in calls if os.path.dirname(a) != os.path.dirname(b))
    print("walk: %d files, %d calls between files, %d climbing; %d rooms, %d switches" %
          (len(files), len(calls), len(climbs), len(rooms), switches))
    flat = {f: room_before_split(f) for f in files}
    print("walk, rooms before src/ was split: %d rooms, %d switches" %
          (len(set(flat.values())), sum(1 for a, b in calls if flat[a] != flat[b])))


if __name__ == "__main__":
    main()
