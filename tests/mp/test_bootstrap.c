/* Multi-process bootstrap: NCCL_COMM_ID, stray connections to the root, IPv6,
 * ncclCommInitAll with one-thread groups, config structs and comm queries. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "archeck.h"
#include "braid.h"
#include "launcher.h"

#define IPV6_CHILD_ARG "--ipv6-child"
#define STRAY_WAIT_MS 15000
#define INITALL_MAX 8

/* ---- shared pieces ---- */

/* A few checked all-reduces on comm, then destroy. 0 when all is well. */
static int use_and_destroy(const mp_env* env, ncclComm_t comm) {
  int bad = 0;
  for (int i = 0; i < 4 && bad == 0; i++) {
    ar_call c = {.type = (ncclDataType_t)(3 * i + 1),
                 .kind = i,
                 .count = i == 3 ? (size_t)300001 : (size_t)(1000 * i + 7),
                 .inplace = i & 1,
                 .salt = 31u + (uint64_t)i};
    if (ar_alloc(&c) != 0) return 1;
    ar_op_create(env, comm, c.type, c.kind, &c.op);
    int r = ar_run(&c, env, comm);
    if (r < 0) {
      ncclCommAbort(comm);
      return 1;
    }
    bad += r;
  }
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void set_comm_id(const char* host, int port) {
  char v[96];
  snprintf(v, sizeof(v), "%s:%d", host, port);
  setenv("NCCL_COMM_ID", v, 1);
}

/* ncclGetUniqueId + ncclCommInitRank as every rank does under NCCL_COMM_ID. */
static int init_from_env_id(const mp_env* env, ncclComm_t* comm) {
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclGetUniqueId with NCCL_COMM_ID")) return 1;
  rc = ncclCommInitRank(comm, env->nranks, id, env->rank);
  return mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRank with NCCL_COMM_ID");
}

/* ---- NCCL_COMM_ID ---- */

typedef struct comm_id_arg {
  const char* host;
  int port;
  int root_late_ms; /* rank 0 (the root host) starts this much later */
} comm_id_arg;

static int comm_id_body(const mp_env* env) {
  const comm_id_arg* a = env->arg;
  ncclComm_t comm = NULL;
  set_comm_id(a->host, a->port);
  if (env->rank == 0 && a->root_late_ms > 0) mp_sleep_ms(a->root_late_ms);
  if (init_from_env_id(env, &comm) != 0) return 1;
  return use_and_destroy(env, comm);
}

static void run_comm_id(int nranks, int root_late_ms) {
  comm_id_arg a = {"127.0.0.1", mp_free_port(AF_INET), root_late_ms};
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_not_equal(a.port, 0);
  assert_int_equal(mp_launch(nranks, comm_id_body, &a, &o), 0);
}

static void test_comm_id_env(void** state) {
  (void)state;
  run_comm_id(3, 0);
}

/* The other ranks try to reach the root before rank 0 hosts it. */
static void test_comm_id_root_late(void** state) {
  (void)state;
  run_comm_id(4, 500);
}

/* ---- stray connections to the root ---- */

static int connect_retry(int port, double timeout_s) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (double end = mp_now() + timeout_s; mp_now() < end; mp_sleep_ms(20)) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr*)&a, sizeof(a)) == 0) return fd;
    close(fd);
  }
  return -1;
}

/* One stray: kind 0 random bytes, 1 nothing, 2 0xff bytes (huge lengths),
 * 3 a few bytes then silence for a while. */
static int stray(int port, int kind) {
  unsigned char junk[256];
  int fd = connect_retry(port, 10.0);
  if (fd < 0) return -1;
  for (size_t i = 0; i < sizeof(junk); i++)
    junk[i] = kind == 2 ? 0xff : (unsigned char)(i * 131u + 17u);
  if (kind == 0 || kind == 2) send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
  if (kind == 3) {
    send(fd, junk, 3, MSG_NOSIGNAL);
    mp_sleep_ms(500);
  }
  close(fd);
  return 0;
}

static int attacker(const mp_env* env, int port) {
  for (int k = 0; k < 4; k++) {
    if (stray(port, k) != 0) {
      mp_fail(env, "stray connection %d: could not reach the root on port %d", k, port);
      return 1;
    }
  }
  __atomic_store_n(&env->shm[0], 1, __ATOMIC_SEQ_CST);
  for (int k = 0; k < 4; k++) stray(port, k); /* more, racing the real ranks */
  return 0;
}

static int stray_real_rank(const mp_env* env, const mp_env* real) {
  ncclComm_t comm = NULL;
  if (env->rank != 0 && !mp_wait_flag(&env->shm[0], STRAY_WAIT_MS)) {
    mp_fail(env, "the attacker never finished its stray connections");
    return 1;
  }
  if (init_from_env_id(real, &comm) != 0) return 1;
  return use_and_destroy(real, comm);
}

static int stray_body(const mp_env* env) {
  const comm_id_arg* a = env->arg;
  mp_env real = *env;
  real.nranks = env->nranks - 1; /* the last process is the attacker */
  if (env->rank == real.nranks) return attacker(env, a->port);
  set_comm_id(a->host, a->port);
  if (env->rank != 0) return stray_real_rank(env, &real);
  mp_capture cap; /* rank 0 hosts the root: keep its log */
  if (mp_capture_begin(&cap) != 0) return stray_real_rank(env, &real);
  int bad = stray_real_rank(env, &real);
  int warned = mp_capture_end(&cap, "WARN");
  if (warned == 0) mp_fail(env, "the root logged no warning about the stray connections");
  return bad + (warned == 0);
}

static void test_stray_connections(void** state) {
  (void)state;
  comm_id_arg a = {"127.0.0.1", mp_free_port(AF_INET), 0};
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_not_equal(a.port, 0);
  assert_int_equal(mp_launch(4, stray_body, &a, &o), 0);
}

/* ---- IPv6 (in a re-executed process: the library picks its address once) ---- */

static const char kV6Loopback[] = "00000000000000000000000001000000";

static int own_socket(unsigned long inode) {
  char want[64], path[300], link[64];
  snprintf(want, sizeof(want), "socket:[%lu]", inode);
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  int found = 0;
  while (d && !found && (e = readdir(d)) != NULL) {
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n > 0) link[n] = '\0';
    found = n > 0 && strcmp(link, want) == 0;
  }
  if (d) closedir(d);
  return found;
}

/* This process's TCP sockets in table whose local address starts with local
 * (NULL: any). */
static int count_own_tcp(const char* table, const char* local) {
  FILE* f = fopen(table, "r");
  char line[512], addr[64];
  unsigned long inode;
  int n = 0;
  if (!f) return 0;
  if (!fgets(line, sizeof(line), f)) line[0] = '\0'; /* header */
  while (fgets(line, sizeof(line), f)) {
    if (sscanf(line, " %*s %63[0-9A-Fa-f]:%*x %*s %*x %*s %*s %*s %*u %*u %lu", addr, &inode) != 2)
      continue;
    if ((!local || strcmp(addr, local) == 0) && own_socket(inode)) n++;
  }
  fclose(f);
  return n;
}

static int ipv6_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int v6 = count_own_tcp("/proc/net/tcp6", kV6Loopback);
  int v4 = count_own_tcp("/proc/net/tcp", NULL);
  mp_log(env, "after init: %d TCP sockets on ::1, %d IPv4 TCP sockets", v6, v4);
  if (v6 == 0) {
    mp_fail(env, "NCCL_SOCKET_FAMILY=AF_INET6: no socket of this rank is bound to ::1");
    ncclCommAbort(comm);
    return 1;
  }
  return use_and_destroy(env, comm);
}

static int ipv6_main(void) {
  setenv("NCCL_SOCKET_FAMILY", "AF_INET6", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  return mp_launch(3, ipv6_body, NULL, NULL) == 0 ? 0 : 1;
}

static int exec_ipv6_body(const mp_env* env) {
  execl("/proc/self/exe", "mp_bootstrap", IPV6_CHILD_ARG, (char*)NULL);
  mp_fail(env, "cannot re-execute /proc/self/exe");
  return 1;
}

static int have_ipv6_loopback(void) {
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof(a));
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  int ok = fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

static void test_ipv6(void** state) {
  (void)state;
  if (!have_ipv6_loopback()) {
    fprintf(stderr, "::1 is not configured: skipping the IPv6 test\n");
    skip();
  }
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_equal(mp_launch(1, exec_ipv6_body, NULL, &o), 0);
}

/* ---- ncclCommInitAll + a group from one thread ---- */

static int initall_queries(const mp_env* env, ncclComm_t* comms, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int count = -1, rank = -1;
    bad += mp_expect_rc(env, comms[i], ncclCommCount(comms[i], &count), ncclSuccess, "Count");
    bad += mp_expect_rc(env, comms[i], ncclCommUserRank(comms[i], &rank), ncclSuccess, "UserRank");
    if (count == n && rank == i) continue;
    mp_fail(env, "InitAll comm %d: count %d rank %d, expected %d and %d", i, count, rank, n, i);
    bad++;
  }
  return bad;
}

/* One round: comm i runs call i (its own type/op), all in one group. */
static int initall_round(const mp_env* env, ncclComm_t* comms, int n, int round) {
  ar_call calls[INITALL_MAX];
  mp_env envs[INITALL_MAX];
  int bad = 0;
  for (int i = 0; i < n; i++) {
    envs[i] = *env;
    envs[i].rank = i;
    envs[i].nranks = n;
    ar_call c = {.type = (ncclDataType_t)((round * 5 + 3) % ncclNumTypes),
                 .kind = round % AR_NKINDS,
                 .count = round == 1 ? (size_t)262147 : (size_t)(4099 + 13 * round),
                 .inplace = round & 1,
                 .salt = 900u + (uint64_t)round};
    calls[i] = c;
    if (ar_op_create(&envs[i], comms[i], c.type, c.kind, &calls[i].op) != 0) return 1;
    if (ar_alloc(&calls[i]) != 0 || ar_prepare(&calls[i], &envs[i]) != 0) return 1;
  }
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int i = 0; i < n; i++)
    bad += mp_expect_rc(&envs[i], comms[i], ar_issue(&calls[i], comms[i]), ncclSuccess,
                        "ncclAllReduce in group");
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  for (int i = 0; i < n; i++) {
    if (bad == 0) bad += ar_verify(&calls[i], &envs[i]);
    ar_op_destroy(&envs[i], comms[i], calls[i].kind, calls[i].op);
    ar_release(&calls[i]);
  }
  return bad;
}

static int initall_body(const mp_env* env) {
  const int* np = env->arg;
  int n = *np;
  ncclComm_t comms[INITALL_MAX] = {NULL};
  ncclResult_t rc = ncclCommInitAll(comms, n, NULL);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitAll")) return 1;
  int bad = initall_queries(env, comms, n);
  for (int round = 0; round < 6 && bad == 0; round++) bad += initall_round(env, comms, n, round);
  for (int i = 0; i < n; i++) {
    if (bad)
      ncclCommAbort(comms[i]);
    else
      bad += mp_expect_rc(env, comms[i], ncclCommDestroy(comms[i]), ncclSuccess, "Destroy");
  }
  return bad != 0;
}

static void test_initall_group(void** state) {
  (void)state;
  static const int sizes[] = {4, 1, 3};
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    int n = sizes[i];
    assert_int_equal(mp_launch(1, initall_body, &n, &o), 0);
  }
}

/* ---- ncclConfig_t from a newer header, and a bad magic ---- */

/* Configs as NCCL 2.19, 2.28 and 2.32 headers make them: the same layout,
 * cut at 48, 80 and 120 bytes. The bytes past `size` belong to whatever
 * the caller put there: poisoned, they must not be read. */
static const size_t k_config_sizes[] = {48, 80, 120};

static int config_size_body(const mp_env* env) {
  struct {
    ncclConfig_t cfg;
    unsigned char after[64];
  } buf;
  int bad = 0;
  for (size_t i = 0; i < sizeof(k_config_sizes) / sizeof(k_config_sizes[0]); i++) {
    ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
    memset(&buf, 0x7f, sizeof(buf));
    memcpy(&buf.cfg, &def, k_config_sizes[i]);
    buf.cfg.size = k_config_sizes[i];
    buf.cfg.blocking = 1;
    ncclComm_t comm = NULL;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, env->nranks, env->ids[i], env->rank, &buf.cfg);
    if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRankConfig(sized config)")) return 1;
    bad += use_and_destroy(env, comm);
  }
  return bad;
}

static void test_config_sizes(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.nids = (int)(sizeof(k_config_sizes) / sizeof(k_config_sizes[0]));
  assert_int_equal(mp_launch(2, config_size_body, NULL, &o), 0);
}

/* A bad magic is refused up front; the same id then still initializes. */
static int bad_magic_body(const mp_env* env) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  cfg.magic = 0xdeadbeef;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, env->nranks, env->id, env->rank, &cfg);
  int bad = mp_expect_rc(env, NULL, rc, ncclInvalidArgument, "InitRankConfig(magic 0xdeadbeef)");
  if (!bad) bad = mp_expect_last_error(env, NULL, "InitRankConfig(magic 0xdeadbeef)");
  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  rc = ncclCommInitRankConfig(&comm, env->nranks, env->id, env->rank, &good);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRankConfig after a bad magic"))
    return 1;
  return use_and_destroy(env, comm) + bad;
}

static void test_config_bad_magic(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, bad_magic_body, NULL, NULL), 0);
}

/* ---- version and comm queries ---- */

static int expect_int(const mp_env* env, const char* what, int got, int want) {
  if (got == want) return 0;
  mp_fail(env, "%s is %d, expected %d", what, got, want);
  return 1;
}

static int queries_body(const mp_env* env) {
  int version = 0, count = -1, rank = -1, dev = -7;
  int bad = mp_expect_rc(env, NULL, ncclGetVersion(&version), ncclSuccess, "ncclGetVersion");
  bad += expect_int(env, "ncclGetVersion", version, BRAID_NCCL_LEVEL);
  bad += expect_int(env, "NCCL_VERSION_CODE", NCCL_VERSION_CODE, 23203);
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, env->nranks, env->id, env->rank, NULL);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRankConfig(config=NULL)")) return 1;
  bad += mp_expect_rc(env, comm, ncclCommCount(comm, &count), ncclSuccess, "ncclCommCount");
  bad += mp_expect_rc(env, comm, ncclCommUserRank(comm, &rank), ncclSuccess, "ncclCommUserRank");
  bad += mp_expect_rc(env, comm, ncclCommCuDevice(comm, &dev), ncclSuccess, "ncclCommCuDevice");
  bad += expect_int(env, "ncclCommCount", count, env->nranks);
  bad += expect_int(env, "ncclCommUserRank", rank, env->rank);
  if (env->rank == 0) mp_log(env, "ncclCommCuDevice reports %d", dev);
  bad += mp_expect_rc(env, comm, ncclCommFinalize(comm), ncclSuccess, "ncclCommFinalize");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_queries(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, queries_body, NULL, NULL), 0);
}

int main(int argc, char** argv) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  mp_default_env("NCCL_DEBUG", "WARN"); /* the stray test checks the root's log */
  if (argc > 1 && strcmp(argv[1], IPV6_CHILD_ARG) == 0) return ipv6_main();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_comm_id_env),       cmocka_unit_test(test_comm_id_root_late),
      cmocka_unit_test(test_stray_connections), cmocka_unit_test(test_ipv6),
      cmocka_unit_test(test_initall_group),     cmocka_unit_test(test_config_sizes),
      cmocka_unit_test(test_config_bad_magic),  cmocka_unit_test(test_queries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
