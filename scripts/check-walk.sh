#!/usr/bin/env bash
# docs/architecture.md's walk figures, checked (make test runs it after the build): what
# perf/call_walk.sh measures for one all-reduce on host buffers and on device buffers (the
# simulated driver) must be what the doc's "Walks today:" line says, so the figure cannot drift
# from the code. A build without CUDA has no device walk: then only the host one is compared.
#   scripts/check-walk.sh BUILD
set -euo pipefail
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
doc=$top/docs/architecture.md
if ! command -v valgrind >/dev/null || ! command -v mpirun >/dev/null; then
  echo "check-walk: valgrind or mpirun missing (scripts/deps.sh installs them)" >&2
  exit 1
fi
walks=$("$top/perf/call_walk.sh" "$build" 2>&1 | sed -n 's/^walk: //p') || true
host=$(sed -n 1p <<<"$walks")
dev=$(sed -n 2p <<<"$walks")
if [ -z "$host" ]; then
  echo "check-walk: perf/call_walk.sh gave no walk" >&2
  exit 1
fi
said=$(tr '\n' ' ' <"$doc" | tr -s ' ' | grep -o 'Walks today: host [^;]*;[^.]*\.' || true)
want_host=$(sed -n 's/^Walks today: host \(.*\); device .*/\1/p' <<<"$said")
want_dev=$(sed -n 's/^Walks today: host .*; device \(.*\)\.$/\1/p' <<<"$said")
fmt() { # "39 files, 70 calls between files, 0 climbing; 13 rooms, 47 switches" -> one line
  sed 's/ calls between files/ calls/; s/;/,/' <<<"$1"
}
bad=0
if [ "$(fmt "$host")" != "$want_host" ]; then
  echo "check-walk: host walk is '$(fmt "$host")', docs/architecture.md says '$want_host':" \
    "update its 'Walks today:' line"
  bad=1
fi
if [ -n "$dev" ] && [ "$(fmt "$dev")" != "$want_dev" ]; then
  echo "check-walk: device walk is '$(fmt "$dev")', docs/architecture.md says '$want_dev':" \
    "update its 'Walks today:' line"
  bad=1
fi
[ $bad = 0 ] || exit 1
if [ -n "$dev" ]; then
  echo "check-walk: host $(fmt "$host"); device $(fmt "$dev")"
else
  echo "check-walk: host $(fmt "$host"); no device walk in this build"
fi
