#!/usr/bin/env bash
# The layer rules of docs/architecture.md ("Layers"), checked on the sources:
#
#  include: every #include "..." of a library or tool source (common/ gpu/ src/
#           transports/ algorithms/ kernels/ perf/ trainer/ tools/; tests may see
#           everything) must resolve in its own directory or in a folder its
#           top folder may include from. The lists are the Makefile's, the
#           same ones the compiler gets as -I flags (make print-layers).
#  env:     library code reads the environment only through the table of
#           common/param_table.h, so every knob is a row with a default the
#           docs/environment.md is checked against: getenv( or an uncached param_read_int(
#           / param_read_range( outside common/param.[ch] must say why on its
#           line with "not-a-param".
#
# Prints one line per violation (file:line, what, which rule) and exits 1
# when there is any. Run by make test; alone: scripts/check-layers.sh.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2

declare -A allowed=()
while read -r word folder rest; do
  [ "$word" = layer ] && allowed[${folder%:}]=$rest
done < <(${MAKE:-make} -s --no-print-directory print-layers 2>/dev/null)
if [ ${#allowed[@]} -eq 0 ]; then
  echo "check-layers: no rules from 'make print-layers'" >&2
  exit 2
fi

checked=(common gpu src transports algorithms kernels sim perf trainer tools)
bad=0

violation() {
  echo "check-layers: $*"
  bad=$((bad + 1))
}

# The top folder of a path relative to the repository ("" outside it).
top_of() {
  case "$1" in
    /* | ../*) echo "" ;;
    */*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}

# Where the compiler would find `inc` for `file`: its own directory first,
# then each folder of `list`; prints the relative path, or nothing.
resolve() {
  local file=$1 inc=$2 list=$3 d
  if [ -f "$(dirname "$file")/$inc" ]; then
    realpath -m --relative-to="$top" "$(dirname "$file")/$inc"
    return
  fi
  for d in $list; do
    [ -f "$d/$inc" ] && realpath -m --relative-to="$top" "$d/$inc" && return
  done
}

# Which project folder holds `inc` at all (for the message on a crossing).
find_anywhere() {
  local inc=$1 d
  for d in include "${checked[@]}" tests; do
    [ -f "$d/$inc" ] && echo "$d/$inc" && return
    local hit
    hit=$(find "$d" -path "*/$inc" -type f -print -quit 2>/dev/null)
    [ -n "$hit" ] && echo "$hit" && return
  done
}

check_includes() {
  local file=$1 folder list lineno inc path where
  folder=$(top_of "$file")
  list=${allowed[$folder]-}
  if [ -z "$list" ]; then
    violation "$file: folder $folder/ has no layer rule (add LAYER_$folder to the Makefile)"
    return
  fi
  while IFS=: read -r lineno inc; do
    path=$(resolve "$file" "$inc" "$list")
    if [ -n "$path" ]; then
      case " $list " in
        *" $(top_of "$path") "*) continue ;;
      esac
      where=$path
    else
      where=$(find_anywhere "$inc")
    fi
    if [ -n "$where" ]; then
      violation "$file:$lineno includes \"$inc\" ($where): rule: $folder/ may include only from" \
        "$(echo "$list" | sed 's/\([^ ]*\)/\1\//g')"
    else
      violation "$file:$lineno includes \"$inc\", which is in none of $list"
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" |
    sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
}

check_env() {
  local file=$1
  local lineno text
  case "$file" in common/param.[ch] | perf/* | trainer/*) return ;; esac # tools: not the library
  while IFS=: read -r lineno text; do
    case "$text" in *not-a-param*) continue ;; esac
    violation "$file:$lineno reads the environment itself: rule: the library reads it only" \
      "through the rows of common/param_table.h (or says why on the line: not-a-param)"
  done < <(grep -nE '\b((secure_)?getenv|param_read_int|param_read_range)[[:space:]]*\(' "$file")
}

nfiles=0
while IFS= read -r -d '' f; do
  f=${f#./}
  nfiles=$((nfiles + 1))
  check_includes "$f"
  check_env "$f"
done < <(find "${checked[@]}" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
  -print0 2>/dev/null | sort -z)

if [ "$bad" -ne 0 ]; then
  echo "check-layers: $bad violation(s) in $nfiles files (rules: docs/architecture.md \"Layers\", make print-layers)"
  exit 1
fi
echo "check-layers: $nfiles files, every include within its layer, no stray getenv"
