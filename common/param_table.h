/*
 * Every NCCL_* / BRAID_* environment variable the library reads, one row
 * each; param.h declares a getter per row (param_<getter>()) and param.c
 * defines it. docs/environment.md's table must list the same names
 * with the same defaults (tests/unit/test_params.c checks both ways).
 *
 *   INT(getter, NAME, default, lo, hi, flags, doc)
 *       an integer with K/M/G suffixes; a malformed value WARNs and keeps
 *       the default, one outside [lo, hi] WARNs and is clamped
 *   STR(getter, NAME, default, shown, flags, doc)
 *       a string; the getter returns `default` (NULL: none) when the
 *       variable is unset or empty. `shown` is the documented default when
 *       `default` is NULL: what the library does instead of a value
 *
 * flags: PARAM_ZERO_OFF  0 is valid too (turns the knob off), outside [lo, hi]
 *        PARAM_EARLY     read by the logger itself, before logging exists:
 *                        logged once logging is set up (debug.c)
 */
#ifndef BRAID_PARAM_TABLE_H_
#define BRAID_PARAM_TABLE_H_

#define PARAM_KIB (1LL << 10)
#define PARAM_MIB (1LL << 20)
#define PARAM_GIB (1LL << 30)

/* The smallest pipeline chunk: below it per-message costs dominate. */
#define PARAM_CHUNK_MIN 4096

#define PARAM_TABLE(INT, STR)                                                                     \
  /* logging (common/debug.c) */                                                                  \
  STR(debug, "NCCL_DEBUG", NULL, "unset", PARAM_EARLY, "log level: VERSION, WARN, INFO, TRACE")   \
  STR(debug_subsys, "NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV", NULL, PARAM_EARLY,                 \
      "subsystems logged at INFO: comma list, ^ excludes")                                        \
  STR(debug_file, "NCCL_DEBUG_FILE", NULL, "stdout", PARAM_EARLY,                                 \
      "log file instead of stdout; %h host, %p pid")                                              \
  /* bootstrap and sockets (src/bootstrap/bootstrap.c, common/socket.c) */                        \
  STR(comm_id, "NCCL_COMM_ID", NULL, "unset", 0, "host:port of the bootstrap root")               \
  INT(bootstrap_fanout, "BRAID_BOOTSTRAP_FANOUT", 8, 1, 1024, 0,                                  \
      "ranks each root and rank hands the peer table to (src/bootstrap/bootstrap_relay.h)")       \
  STR(job_id, "BRAID_JOB_ID", NULL, "unset", 0, "mixed into the job key of NCCL_COMM_ID jobs")    \
  STR(socket_ifname, "NCCL_SOCKET_IFNAME", NULL, "^docker,lo, then lo", 0,                        \
      "interfaces to use: prefixes, ^ excludes, = exact names")                                   \
  STR(socket_family, "NCCL_SOCKET_FAMILY", NULL, "any (IPv4 first)", 0, "AF_INET or AF_INET6")    \
  INT(socket_nthreads, "NCCL_SOCKET_NTHREADS", 1, 1, 16, 0, "socket groups per peer")             \
  INT(nsocks_perthread, "NCCL_NSOCKS_PERTHREAD", 2, 1, 64, 0, "sockets per group")                \
  INT(sock_buf, "BRAID_SOCKET_BUF", 0, 64 * PARAM_KIB, PARAM_GIB, PARAM_ZERO_OFF,                 \
      "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel's autotuning")                     \
  STR(hostid, "NCCL_HOSTID", NULL, "hostname + boot id", 0, "host identity that groups ranks")    \
  INT(timeout_ms, "BRAID_TIMEOUT_MS", 300000, 100, 1LL << 40, 0,                                  \
      "bootstrap waits and stalled calls fail after this")                                        \
  /* the transport table (transports/transport_table.c) */                                        \
  STR(net, "NCCL_NET", NULL, "Socket", 0, "network between hosts: Socket, IB or a plugin's")      \
  STR(net_plugin, "NCCL_NET_PLUGIN", NULL, "libnccl-net.so", 0,                                   \
      "the net plugin library (docs/net-plugins.md); none: no plugin")                            \
  /* InfiniBand / RoCE (transports/ib: the probe of NCCL_NET=IB so far) */                        \
  STR(ib_hca, "NCCL_IB_HCA", NULL, "every active port", 0,                                        \
      "HCAs to use: name[:port] list, prefixes, ^ excludes, = exact names")                       \
  INT(ib_disable, "NCCL_IB_DISABLE", 0, 0, 1, 0, "1: no InfiniBand, even if NCCL_NET=IB")         \
  INT(ib_timeout, "NCCL_IB_TIMEOUT", 20, 1, 31, 0, "QP ack timeout: 4.096 us x 2^value")          \
  INT(ib_retry_cnt, "NCCL_IB_RETRY_CNT", 7, 0, 7, 0, "QP transport retries before an error")      \
  INT(ib_sl, "NCCL_IB_SL", 0, 0, 15, 0, "InfiniBand service level of the QPs")                    \
  INT(ib_tc, "NCCL_IB_TC", 0, 0, 255, 0, "RoCE traffic class of the QPs")                         \
  INT(ib_qps_per_conn, "NCCL_IB_QPS_PER_CONNECTION", 1, 1, 16, 0,                                 \
      "QPs per connection, each message striped across them (the sending end's count rules)")     \
  INT(ib_gid_index, "NCCL_IB_GID_INDEX", -1, -1, 255, 0,                                          \
      "RoCE GID index; -1: chosen by family, range and RoCE version")                             \
  INT(ib_roce_version, "NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2, 0, "RoCE version of the GID to use")  \
  STR(ib_addr_family, "NCCL_IB_ADDR_FAMILY", "AF_INET", NULL, 0,                                  \
      "RoCE GID address family: AF_INET or AF_INET6")                                             \
  STR(ib_addr_range, "NCCL_IB_ADDR_RANGE", NULL, "any", 0,                                        \
      "RoCE GID address range, a CIDR prefix (10.0.0.0/8, fd00::/8)")                             \
  /* CUDA IPC (transports/cudaipc) */                                                             \
  INT(p2p_disable, "NCCL_P2P_DISABLE", 0, 0, 1, 0,                                                \
      "1: device buffers of one node's ranks go through host memory, not CUDA IPC")               \
  /* shared memory (transports/shm) */                                                            \
  INT(shm_disable, "NCCL_SHM_DISABLE", 0, 0, 1, 0, "1: ranks of one node talk TCP")               \
  INT(shm_nslots, "BRAID_SHM_NSLOTS", 32, 1, 4096, 0, "slots per shared-memory FIFO")             \
  INT(shm_slot_bytes, "BRAID_SHM_SLOT_BYTES", 128 * PARAM_KIB, 4 * PARAM_KIB, PARAM_GIB, 0,       \
      "bytes per slot")                                                                           \
  INT(shm_direct_min, "BRAID_SHM_DIRECT_MIN", 0, 0, INT64_MAX, 0,                                 \
      "messages this large are read straight from the sender; 0: never")                          \
  /* the engine and the tuner (src/) */                                                           \
  STR(algo, "NCCL_ALGO", NULL, "tuner", 0, "algorithms allowed: list, ^ excludes")                \
  STR(tune_file, "BRAID_TUNE_FILE", NULL, "unset", 0, "tuner overrides")                          \
  STR(cuda_lib, "BRAID_CUDA_LIB", "libcuda.so.1", NULL, 0,                                        \
      "CUDA driver opened at first need; the tests' simulated driver, or none")                   \
  INT(stream_memops, "BRAID_STREAM_MEMOPS", 1, 0, 1, 0,                                           \
      "order device calls by stream memory operations; 0: synchronous calls")                     \
  STR(ibverbs_lib, "BRAID_IBVERBS_LIB", "libibverbs.so.1", NULL, 0,                               \
      "the verbs library, opened at run time")                                                    \
  STR(hwloc_lib, "BRAID_HWLOC_LIB", "libhwloc.so.15", NULL, 0,                                    \
      "hwloc library opened for topology detection; none: use sysfs and sysconf")                 \
  STR(topo_file, "NCCL_TOPO_FILE", NULL, "unset", 0, "topology to use instead of detecting it")   \
  STR(topo_dump_file, "NCCL_TOPO_DUMP_FILE", NULL, "unset", 0, "write the topology in use here")  \
  INT(chunk_size, "BRAID_CHUNK_SIZE", 64 * PARAM_KIB, PARAM_CHUNK_MIN, 64 * PARAM_MIB, 0,         \
      "largest pipeline slice and staging slot")                                                  \
  INT(nsteps, "BRAID_NSTEPS", 16, 4, 32, 0, "slices in flight per communicator")                  \
  INT(spin_us, "BRAID_SPIN_US", 100, 0, 1000000, 0, "polling before sleeping when idle")          \
  INT(deterministic, "BRAID_DETERMINISTIC", 0, 0, 1, 0,                                           \
      "1: every reduction in the canonical pairwise order, the same bits however it runs")        \
  /* kernels (kernels/cpu) */                                                                     \
  STR(kernel_isa, "BRAID_KERNEL_ISA", NULL, "best", 0, "CPU kernel path: portable, avx2, avx512") \
  /* hung jobs (src/status/flight.c, src/status/status_service.c) */                              \
  INT(flight_entries, "BRAID_FLIGHT_ENTRIES", 256, 0, 65536, 0,                                   \
      "operations each communicator remembers (0: no recorder)")                                  \
  STR(trace_dir, "BRAID_TRACE_DIR", NULL, "unset", 0,                                             \
      "where a rank writes its recorder on a timeout, remote error or abort")                     \
  STR(op_log, "BRAID_OP_LOG", NULL, "unset", 0,                                                   \
      "a JSON line per operation, to this path (%h host, %p pid)")                                \
  INT(status, "BRAID_STATUS", 1, 0, 1, 0, "0: no status service (braid-status cannot ask)")

#endif /* BRAID_PARAM_TABLE_H_ */
