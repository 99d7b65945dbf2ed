# Shared by perf/compare_mpi.sh and perf/compare_shm.sh (sourced, not run): one node's mpirun
# launch, a logged run, and per-size medians over rounds of nccl-tests-style tables.
# The caller sets OUT (a scratch directory), TMO (seconds per run) and MPI_ARGS (the transport
# options for both systems), then calls bench_launch NP.

# bench_launch NP: LAUNCH, mpirun for NP ranks in a container: loopback only for the runtime's
# own wiring, root allowed when root, oversubscribed (MPI yielding when idle) past the cores.
bench_launch() {
  local np=$1
  LAUNCH=(mpirun -np "$np" --bind-to none --mca oob_tcp_if_include lo)
  # No munge for PMIx (a stale munge socket costs mpirun 2.3 s; see scripts/run-tests.sh).
  export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    LAUNCH+=(--allow-run-as-root)
  fi
  if [ "$(nproc 2>/dev/null || echo 1)" -lt "$np" ]; then
    LAUNCH+=(--oversubscribe --mca mpi_yield_when_idle 1)
  fi
}

# bench_run NAME ARGS...: prints the output and keeps it in $OUT/NAME
bench_run() {
  local name=$1
  shift
  echo "### ${LAUNCH[*]} ${MPI_ARGS[*]} $*"
  timeout "$TMO" "${LAUNCH[@]}" "${MPI_ARGS[@]}" "$@" >"$OUT/$name" 2>&1
  local rc=$?
  cat "$OUT/$name"
  [ "$rc" = 0 ] || echo "### exit status $rc$([ "$rc" = 124 ] && echo " (timed out after ${TMO}s)")"
  echo
}

# Table rows: size count type redop root time algbw busbw #wrong (out-of-place) time ... (in-place)
# bench_rows NAME: "size time busbw" per size from the rounds $OUT/NAME.*: the median round's
# (by time) out-of-place time and busbw.
bench_rows() {
  cat "$OUT/$1".* 2>/dev/null | awk '!/^#/ && NF >= 13 { print $1, $6, $8 }' | sort -k1,1n -k2,2g |
    awk '{ n[$1]++; t[$1, n[$1]] = $2; b[$1, n[$1]] = $3 }
         END { for (s in n) { m = int((n[s] + 1) / 2); print s, t[s, m], b[s, m] } }' |
    sort -k1,1n
}
