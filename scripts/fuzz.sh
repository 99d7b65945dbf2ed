#!/usr/bin/env bash
# make fuzz: every libFuzzer target tests/fuzz/fuzz_<name>.c, built with clang
# -fsanitize=fuzzer,address,undefined against the library built with matching
# flags in build-fuzz/, each run for FUZZ_SECONDS (30) from its seeds
# (tests/fuzz/corpus/<name>/, read only) and what earlier runs found
# (build-fuzz/corpus/<name>/), with tests/fuzz/<name>.dict when there is one.
# A target fails on a crash, a sanitizer report, a broken property, a timeout
# or an out-of-memory input; the input is left in build-fuzz/artifacts/<name>/.
# A summary at the end (executions per target), non-zero when one failed.
#
#   scripts/fuzz.sh [name...]       (all targets when none is named)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
secs=${FUZZ_SECONDS:-30}
cc=${FUZZ_CC:-clang}
build=build-fuzz
make_cmd=${MAKE:-make}
jobs=()
case " ${MAKEFLAGS:-} " in
  *jobserver* | *" -j"*) ;;
  *) jobs=(-j"$(nproc)") ;;
esac
san="-fsanitize=address,undefined -fno-sanitize-recover=all"
cflags="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $san"
ldflags="-fsanitize=fuzzer $san"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do names+=("$(basename "$f" .c | sed 's/^fuzz_//')"); done
fi

start=$(date +%s)
echo "##### fuzz: $cc $cflags -> $build/"
"$cc" --version | head -1
if ! "$make_cmd" --no-print-directory "${jobs[@]}" BUILD="$build" CC="$cc" CFLAGS="$cflags" \
  LDFLAGS="$ldflags" fuzz-targets; then
  echo "fuzz: build FAILED"
  exit 1
fi

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
pass=0 fail=0 failed=() summary=()
for n in "${names[@]}"; do
  bin=$build/fuzz/fuzz_$n
  corpus=$build/corpus/$n
  art=$build/artifacts/$n
  mkdir -p "$corpus" "$art"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$art/")
  [ -f "tests/fuzz/$n.dict" ] && args+=(-dict="tests/fuzz/$n.dict")
  dirs=("$corpus")
  [ -d "tests/fuzz/corpus/$n" ] && dirs+=("tests/fuzz/corpus/$n")
  echo "=== fuzz_$n (${secs} s)"
  log=$build/fuzz_$n.log
  # The limit only guards against a fuzzer that does not stop by itself.
  timeout -k 10 $((secs + 120)) "$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  line="fuzz_$n: ${execs:-?} executions (${rate:-?}/s), ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l)"
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1))
    echo "=== fuzz_$n ok: $line"
  else
    fail=$((fail + 1))
    failed+=("fuzz_$n")
    line+=", FAILED rc=$rc"
    # The report: from the sanitizer's or the property's first line on.
    grep -n -m1 -E "ERROR: |runtime error|fuzz property failed|deadly signal|timeout|out-of-memory" "$log" |
      cut -d: -f1 | { read -r first && tail -n +"$first" "$log" | head -60; }
    echo "=== fuzz_$n FAILED rc=$rc: input in $art/ (log $log)"
  fi
  summary+=("$line")
done

echo
printf '%s\n' "${summary[@]}"
echo "fuzz targets: ${#failed[@]} failed: ${failed[*]:-none}; total $(($(date +%s) - start)) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
