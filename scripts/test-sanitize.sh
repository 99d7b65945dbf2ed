#!/usr/bin/env bash
# make test-sanitize: the library and its unit (tests/unit) and multi-process
# (tests/mp) tests built twice with clang, AddressSanitizer + UndefinedBehavior-
# Sanitizer into build-asan/ and ThreadSanitizer into build-tsan/, and every one
# of those test binaries run under a wall-clock limit; a summary at the end,
# non-zero when any binary failed. Not the abi, trainer or cluster scripts.
#
#   scripts/test-sanitize.sh [asan] [tsan]      (both when none is named)
#
# SAN_TESTS="mp_test_lifetime ..." builds and runs only those binaries (make
# test runs its lifetime tests so under ASan with the system compiler);
# SAN_BUILD_PREFIX (build) names the build dirs, <prefix>-asan and
# <prefix>-tsan: objects of two compilers must never meet in one.
# SAN_SEED_BUILD names a finished build whose CUDA kernel fatbins are taken
# as they are (nvcc's output does not depend on the host compiler or its
# flags, and takes it minutes per architecture).
# SAN_BUILD_ONLY=1 builds and stops (make test builds beside its other tests,
# then runs this again, which finds everything built).
# SAN_KERNEL_FLAGS replaces the ASan flags for the CPU kernels alone (make test
# builds them without UBSan: with it they took most of the build).
# SAN_CC (clang), SAN_TEST_LIMIT_S (600 per binary), SAN_TSAN_BIG_COUNT
# (131075: MP_BIG_COUNT for the TSan run, the big count of the all-reduce and
# collective matrices, 1M+3 otherwise; ThreadSanitizer instruments every
# element a reduction touches, and those two matrices took most of its time).
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
cc=${SAN_CC:-clang}
limit=${SAN_TEST_LIMIT_S:-600}
tsan_big=${SAN_TSAN_BIG_COUNT:-131075}
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(asan tsan)
make_cmd=${MAKE:-make}
# Under `make -jN` the sub-make shares its job slots; alone, one job per core.
jobs=()
case " ${MAKEFLAGS:-} " in
  *jobserver* | *" -j"*) ;;
  *) jobs=(-j"$(nproc)") ;;
esac

supp=$top/tests/sanitize
# ASan: leaks too (LSan: the test process at exit, every mp rank before it
# _exits, see tests/mp/launcher.c); full malloc stacks, so that a suppression
# can name a function below a library built without frame pointers.
asan_options="halt_on_error=1:abort_on_error=0:detect_leaks=1:fast_unwind_on_malloc=0"
asan_options+=":detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1"
lsan_options="suppressions=$supp/lsan.supp:print_suppressions=0"
ubsan_options="print_stacktrace=1:halt_on_error=1"
tsan_options="halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=1"

flags_asan="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
flags_tsan="-O1 -g -fsanitize=thread -fno-omit-frame-pointer"

units=() mps=()
if [ -n "${SAN_TESTS:-}" ]; then
  read -r -a units <<<"$SAN_TESTS"
else
  for f in tests/unit/test_*.c; do units+=("$(basename "$f" .c)"); done
  for f in tests/mp/test_*.c; do mps+=("mp_$(basename "$f" .c)"); done
fi

pass=0 fail=0 failed=() start=$(date +%s)
user_cuda_lib=${BRAID_CUDA_LIB:-} # the caller's driver, if it named one

# Runs prefix... binary args... with the limit; counts and prints the result.
run_one() {
  local label=$1
  shift
  local t0 rc
  t0=$(date +%s)
  echo "=== $label"
  timeout -k 10 "$limit" "$@"
  rc=$?
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1))
    echo "=== $label ok ($(($(date +%s) - t0)) s)"
  else
    fail=$((fail + 1))
    failed+=("$label")
    local why=""
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && why=", over the ${limit} s limit"
    echo "=== $label FAILED rc=$rc$why ($(($(date +%s) - t0)) s)"
  fi
}

# ThreadSanitizer of clang 14 wants the old 28-bit mmap randomization; where
# the kernel randomizes more (vm.mmap_rnd_bits=32 on newer distributions) it
# dies with "unexpected memory mapping": run its binaries without ASLR then.
tsan_prefix() {
  local probe=$build/tsan-probe
  printf 'int main(void) { return 0; }\n' | "$cc" -fsanitize=thread -x c - -o "$probe" || return 1
  if "$probe" >/dev/null 2>&1; then
    prefix=()
  elif setarch "$(uname -m)" -R "$probe" >/dev/null 2>&1; then
    echo "ThreadSanitizer needs ASLR off on this kernel: running under setarch -R"
    prefix=(setarch "$(uname -m)" -R)
  else
    echo "a ThreadSanitizer program does not run here:"
    "$probe"
    return 1
  fi
}

for cfg in "${configs[@]}"; do
  build=${SAN_BUILD_PREFIX:-build}-$cfg
  case $cfg in
    asan) flags=$flags_asan ;;
    tsan) flags=$flags_tsan ;;
    *)
      echo "unknown configuration $cfg (asan, tsan)"
      exit 2
      ;;
  esac
  seed=${SAN_SEED_BUILD:-}/obj/kernels/cuda
  if [ -n "${SAN_SEED_BUILD:-}" ] && ls "$seed"/*.fatbin >/dev/null 2>&1; then
    mkdir -p "$build/obj/kernels/cuda"
    # with the flags that made them: fatbins of other flags are compiled again
    cp -p "$seed"/*.fatbin "$seed"/nvcc-flags "$build/obj/kernels/cuda/"
  fi
  echo "##### $cfg: $cc $flags -> $build/"
  "$cc" --version | head -1
  t0=$(date +%s)
  targets=(lib unit-mp-tests)
  [ -n "${SAN_TESTS:-}" ] && targets=("${units[@]/#/$build/tests/}")
  kflags=()
  [ "$cfg" = asan ] && [ -n "${SAN_KERNEL_FLAGS:-}" ] && kflags=(KERNEL_CFLAGS="$SAN_KERNEL_FLAGS")
  if ! "$make_cmd" --no-print-directory "${jobs[@]}" BUILD="$build" CC="$cc" CFLAGS="$flags" \
    "${kflags[@]}" LDFLAGS="$flags" "${targets[@]}"; then
    fail=$((fail + 1))
    failed+=("$cfg:build")
    echo "=== $cfg build FAILED"
    continue
  fi
  echo "=== $cfg build ok ($(($(date +%s) - t0)) s)"
  [ "${SAN_BUILD_ONLY:-0}" = 1 ] && continue
  prefix=()
  if [ "$cfg" = tsan ]; then
    if ! tsan_prefix; then
      fail=$((fail + 1))
      failed+=("$cfg:runtime")
      continue
    fi
  fi
  # The simulated CUDA driver of this build, instrumented like the tests:
  # the main build's would hide its atomics (the gates' flags) from TSan.
  # (Chosen per build: the other build's, left in the environment, would
  # not load here, as it wants the other sanitizer's runtime.)
  sim=$build/tests/libcudasim.so
  if [ -n "$user_cuda_lib" ]; then
    export BRAID_CUDA_LIB=$user_cuda_lib
  elif [ -f "$sim" ]; then
    export BRAID_CUDA_LIB=$sim
  else
    unset BRAID_CUDA_LIB
  fi
  for b in "${units[@]}" "${mps[@]}"; do
    args=()
    [ "$b" = test_abi ] && args=("$build/lib/libnccl.so.2")
    if [ "$cfg" = asan ]; then
      ASAN_OPTIONS=$asan_options LSAN_OPTIONS=$lsan_options UBSAN_OPTIONS=$ubsan_options \
        run_one "$cfg/$b" "$build/tests/$b" "${args[@]}"
    else
      TSAN_OPTIONS=$tsan_options MP_BIG_COUNT=$tsan_big \
        run_one "$cfg/$b" "${prefix[@]}" "$build/tests/$b" "${args[@]}"
    fi
  done
done

echo
echo "sanitizer test binaries: ${#failed[@]} failed: ${failed[*]:-none}; total $(($(date +%s) - start)) s"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
