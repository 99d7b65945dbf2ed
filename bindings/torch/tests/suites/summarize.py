"""Side-by-side table of junit results: one column per backend (the file's
name), each test's outcome, skip reasons, and totals. Tests that one
backend passes and another fails are listed first."""

import os
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    res = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        status, why = "pass", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, why = "fail", (child.get("message") or "").splitlines()[0][:120]
            elif child.tag == "skipped":
                status, why = "skip", (child.get("message") or "").splitlines()[0][:120]
        res[name] = (status, why)
    return res


def main(paths):
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    data = {n: outcomes(p) for n, p in zip(names, paths)}
    tests = sorted(set().union(*[d.keys() for d in data.values()]))
    print("| " + " | ".join(["totals"] + names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for kind in ("pass", "skip", "fail"):
        print("| " + " | ".join([kind] + [str(sum(1 for t in data[n].values() if t[0] == kind))
                                          for n in names]) + " |")
    print()
    diff = [t for t in tests if len({data[n].get(t, ("-", ""))[0] for n in names}) > 1]
    print(f"{len(diff)} tests whose outcome differs between backends:\n")
    print("| test | " + " | ".join(names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for t in diff:
        cells = []
        for n in names:
            s, why = data[n].get(t, ("-", ""))
            cells.append(s + (f": {why}" if why and s != "pass" else ""))
        print(f"| {t} | " + " | ".join(cells) + " |")
    print()
    reasons = {}
    for n in names:
        for t, (s, why) in data[n].items():
            if s == "skip":
                reasons.setdefault((n, why), []).append(t)
    print("skip reasons:\n")
    print("| backend | reason | tests |")
    print("|---|---|---|")
    for (n, why), ts in sorted(reasons.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        print(f"| {n} | {why} | {len(ts)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
