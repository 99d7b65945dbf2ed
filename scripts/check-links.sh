#!/usr/bin/env bash
# Every relative link of README.md and docs/*.md must lead somewhere: the file or folder
# it names exists, and the #anchor, if any, is a heading of that file (GitHub's rule:
# lower case, punctuation dropped, blanks as hyphens, -1, -2 ... for repeats). Links in
# code are not links; http(s) and mailto links are not checked (no network in CI).
# Prints one line per broken link (file:line: link: why) and exits 1 if there is any.
# Run by make test; alone: scripts/check-links.sh [FILE.md ...].
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

# The lines of a markdown file outside fenced code, as "LINE<TAB>TEXT", inline code cut out.
prose() {
  awk '/^[[:space:]]*(```|~~~)/ { fence = !fence; next }
       !fence { gsub(/`[^`]*`/, ""); printf "%d\t%s\n", NR, $0 }' "$1"
}

# The anchors of a markdown file's headings, one per line.
anchors() {
  prose "$1" | cut -f2- | awk '
    /^#+[[:space:]]/ {
      s = $0
      sub(/^#+[[:space:]]+/, "", s); sub(/[[:space:]]+#*[[:space:]]*$/, "", s)
      s = tolower(s); gsub(/[^a-z0-9 _-]/, "", s); gsub(/ /, "-", s)
      n = seen[s]++
      print (n ? s "-" n : s)
    }'
}

bad=0 nlinks=0
check_file() {
  local md=$1 dir lineno link path anchor target
  dir=$(dirname "$md")
  while IFS=$'\t' read -r lineno link; do
    nlinks=$((nlinks + 1))
    case "$link" in http://* | https://* | mailto:*) continue ;; esac
    path=${link%%#*}
    anchor=""
    [[ "$link" == *"#"* ]] && anchor=${link#*#}
    target=$md
    if [ -n "$path" ]; then
      target=$dir/$path
      if [ ! -e "$target" ]; then
        echo "$md:$lineno: ($link): no such file: $target"
        bad=$((bad + 1))
        continue
      fi
    fi
    if [ -n "$anchor" ]; then
      if [ -d "$target" ] || ! anchors "$target" | grep -qxF -- "$anchor"; then
        echo "$md:$lineno: ($link): no heading with anchor #$anchor in $target"
        bad=$((bad + 1))
      fi
    fi
  done < <(prose "$md" | awk -F'\t' '{
      line = $2
      while (match(line, /\]\([^)[:space:]]+\)/)) {
        printf "%s\t%s\n", $1, substr(line, RSTART + 2, RLENGTH - 3)
        line = substr(line, RSTART + RLENGTH)
      }
    }')
}

files=("$@")
[ ${#files[@]} -eq 0 ] && files=(README.md docs/*.md)
for f in "${files[@]}"; do check_file "$f"; done
if [ "$bad" -ne 0 ]; then
  echo "check-links: $bad broken link(s) of $nlinks in ${#files[@]} files"
  exit 1
fi
echo "check-links: $nlinks links in ${#files[@]} files, every relative one resolves"
