/*
 * The IB probe (transports/ib) against the verbs emulation: NCCL_IB_HCA's
 * rules, the active ports found through libibverbs opened at run time
 * (the emulation selected by LD_LIBRARY_PATH, so each case runs in a
 * child started with it), and NCCL_NET=IB: taken where a port is usable,
 * else refused at init with a WARN saying what was missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ib/ib_devices.h"
#include "ib/ib_hca.h"
#include "nccl.h"

static const char* g_self;

/* ---- NCCL_IB_HCA ---- */

static void test_hca_rules(void** state) {
  (void)state;
  const char* why;
  assert_true(ib_hca_match(NULL, "mlx5_0", 1));
  assert_true(ib_hca_match("", "mlx5_0", 1));
  assert_true(ib_hca_match("mlx5", "mlx5_1", 2));   /* a prefix */
  assert_false(ib_hca_match("=mlx5", "mlx5_1", 1)); /* exact names */
  assert_true(ib_hca_match("=mlx5_1", "mlx5_1", 1));
  assert_true(ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_1", 2)); /* no port: every port */
  assert_false(ib_hca_match("mlx5_0:1", "mlx5_0", 2));
  assert_false(ib_hca_match("^mlx5_0", "mlx5_0", 1)); /* excluded */
  assert_true(ib_hca_match("^mlx5_0:2", "mlx5_0", 1));
  assert_false(ib_hca_match("^=mlx5_0", "mlx5_0", 1));
  assert_true(ib_hca_match("^=mlx5", "mlx5_0", 1));
  assert_true(ib_hca_valid("^=mlx5_0:1,mlx5_1", &why));
  assert_false(ib_hca_valid("mlx5_0:0", &why));
  assert_non_null(why);
  assert_false(ib_hca_valid("mlx5_0:x", &why));
  assert_false(ib_hca_valid(":1", &why));
}

/* ---- through the library (children run with the emulation) ---- */

/* In the child: the ports found, as one line. */
static int child_ports(void) {
  const char* why = NULL;
  const struct ib_verbs* v = ib_verbs_get(&why);
  struct ib_port ports[8];
  int n = 0, nhca = 0;
  if (v == NULL) {
    printf("no verbs: %s\n", why);
    return 1;
  }
  ib_ports_find(v, getenv("NCCL_IB_HCA"), ports, 8, &n, &nhca);
  printf("%d HCAs:", nhca);
  for (int i = 0; i < n; i++) {
    char d[96];
    ib_port_describe(&ports[i], d, sizeof(d));
    printf(" [%s]", d);
  }
  printf("\n");
  return 0;
}

/* In the child: init with NCCL_NET=IB, print the result and last error. */
static int child_init(void) {
  ncclComm_t comm;
  ncclResult_t rc = ncclCommInitAll(&comm, 1, NULL);
  printf("rc %d: %s\n", (int)rc, ncclGetLastError(NULL));
  if (rc == ncclSuccess) ncclCommDestroy(comm);
  return 0;
}

/* Run this binary as child `what` with the emulation (unless emulated is
 * 0) and `env` ("NAME=value" pairs, NULL-terminated); its output line. */
static void run_child(const char* what, int emulated, const char* const* env, char* out,
                      size_t len) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    if (emulated) setenv("LD_LIBRARY_PATH", "build/tests/fakeverbs", 1);
    for (int i = 0; env && env[i]; i++) putenv((char*)env[i]);
    execl(g_self, g_self, what, (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  size_t have = 0;
  for (ssize_t got; have < len - 1 && (got = read(fds[0], out + have, len - 1 - have)) > 0;)
    have += (size_t)got;
  out[have] = '\0';
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  printf("  %s: %s", what, out);
}

static const char* const k_three[] = {"FAKEVERBS_HCAS=mlx5_0:2,mlx5_1:1,roce0:1:eth",
                                      "FAKEVERBS_DOWN=mlx5_0:2", "FAKEVERBS_SYSFS=/tmp/braid_fv",
                                      NULL};

static void test_ports_found(void** state) {
  (void)state;
  char out[512];
  mkdir("/tmp/braid_fv", 0755);
  mkdir("/tmp/braid_fv/mlx5_0", 0755);
  mkdir("/tmp/braid_fv/mlx5_0/device", 0755);
  FILE* f = fopen("/tmp/braid_fv/mlx5_0/device/numa_node", "w");
  assert_non_null(f);
  fprintf(f, "1\n");
  fclose(f);
  run_child("ports", 1, k_three, out, sizeof(out));
  assert_non_null(strstr(out, "3 HCAs: [mlx5_0:1 IB 100000 Mb/s NUMA 1]"));
  assert_null(strstr(out, "mlx5_0:2")); /* down */
  assert_non_null(strstr(out, "[mlx5_1:1 IB 100000 Mb/s NUMA -1]"));
  assert_non_null(strstr(out, "[roce0:1 RoCE 100000 Mb/s NUMA -1]"));
  const char* const excl[] = {k_three[0], k_three[1], "NCCL_IB_HCA=^mlx5_1", NULL};
  run_child("ports", 1, excl, out, sizeof(out));
  assert_null(strstr(out, "mlx5_1"));
  assert_non_null(strstr(out, "mlx5_0:1"));
  assert_non_null(strstr(out, "roce0:1"));
}

/* ---- The port a rank takes, and its price ---- */

static void test_port_pick(void** state) {
  (void)state;
  struct ib_port p[3] = {{.dev = "far", .mbps = 100000, .numa = 1},
                         {.dev = "near", .mbps = 100000, .numa = 0},
                         {.dev = "fast", .mbps = 200000, .numa = -1}};
  assert_int_equal(ib_port_pick(p, 3, 0), 1); /* on the rank's node */
  assert_int_equal(ib_port_pick(p, 3, 1), 0);
  assert_int_equal(ib_port_pick(p, 3, -1), 2); /* node unknown: the fastest */
  assert_int_equal(ib_port_pick(p, 3, 2), 2);  /* none near: the fastest */
  assert_int_equal(ib_port_pick(p, 2, 2), 0);  /* a tie: the first listed */
  assert_true(ib_port_far(&p[0], 0));
  assert_false(ib_port_far(&p[1], 0));
  assert_false(ib_port_far(&p[2], 0)); /* the port's node unknown */
  assert_false(ib_port_far(&p[0], -1));
}

/* This machine's ranks run on NUMA node 0: with an HCA listed first on
 * node 1 and one on node 0, init takes the one on node 0; with only the
 * far one, it says so and the tuner prices the network at the link
 * between sockets. */
static void test_port_numa(void** state) {
  (void)state;
  static char out[1 << 16];
  FILE* f;
  mkdir("/tmp/braid_fv_numa", 0755);
  for (int i = 0; i < 2; i++) {
    char path[96];
    snprintf(path, sizeof(path), "/tmp/braid_fv_numa/mlx5_%d", i);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "/tmp/braid_fv_numa/mlx5_%d/device", i);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "/tmp/braid_fv_numa/mlx5_%d/device/numa_node", i);
    assert_non_null(f = fopen(path, "w"));
    fprintf(f, "%d\n", 1 - i);
    fclose(f);
  }
  const char* const both[] = {"FAKEVERBS_HCAS=mlx5_0:1,mlx5_1:1",
                              "FAKEVERBS_SYSFS=/tmp/braid_fv_numa",
                              "NCCL_NET=IB",
                              "NCCL_DEBUG=INFO",
                              "NCCL_DEBUG_SUBSYS=INIT,NET,TUNING",
                              NULL};
  run_child("init", 1, both, out, sizeof(out));
  assert_non_null(strstr(out, "(NUMA 0) on mlx5_1:1 IB 100000 Mb/s NUMA 0,"));
  assert_non_null(strstr(out, "net NET/IB (100000 Mb/s)"));
  const char* const far[] = {"FAKEVERBS_HCAS=mlx5_0:1", both[1], both[2], both[3], both[4], NULL};
  run_child("init", 1, far, out, sizeof(out));
  assert_non_null(strstr(out, "on mlx5_0:1 IB 100000 Mb/s NUMA 1 across sockets"));
  assert_non_null(strstr(out, "net NET/IB (80000 Mb/s)"));
}

static void test_net_ib_refused(void** state) {
  (void)state;
  char out[1024];
  const char* const found[] = {k_three[0], k_three[1], "NCCL_NET=IB", NULL};
  run_child("init", 1, found, out, sizeof(out));
  assert_non_null(strstr(out, "rc 0:")); /* a usable port: the verbs transport */
  const char* const none[] = {"NCCL_NET=IB", NULL};
  run_child("init", 1, none, out, sizeof(out));
  assert_non_null(strstr(out, "rc 5:"));
  assert_non_null(strstr(out, "no usable RDMA device: 0 HCA(s)"));
  const char* const filtered[] = {k_three[0], "NCCL_NET=IB", "NCCL_IB_HCA==mlx5", NULL};
  run_child("init", 1, filtered, out, sizeof(out));
  assert_non_null(strstr(out, "no active port selected by NCCL_IB_HCA==mlx5"));
  const char* const off[] = {k_three[0], "NCCL_NET=IB", "NCCL_IB_DISABLE=1", NULL};
  run_child("init", 1, off, out, sizeof(out));
  assert_non_null(strstr(out, "rc 5:"));
  assert_non_null(strstr(out, "NCCL_IB_DISABLE=1"));
  const char* const bad[] = {k_three[0], "NCCL_NET=IB", "NCCL_IB_HCA=mlx5_0:300", NULL};
  run_child("init", 1, bad, out, sizeof(out));
  assert_non_null(strstr(out, "malformed"));
  /* the host's own libibverbs (or none): no RDMA device on this machine */
  run_child("init", 0, none, out, sizeof(out));
  assert_non_null(strstr(out, "rc 5:"));
  assert_non_null(strstr(out, "no usable RDMA device"));
}

int main(int argc, char** argv) {
  g_self = argv[0];
  if (argc > 1 && strcmp(argv[1], "ports") == 0) return child_ports();
  if (argc > 1 && strcmp(argv[1], "init") == 0) return child_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hca_rules),      cmocka_unit_test(test_ports_found),
      cmocka_unit_test(test_port_pick),      cmocka_unit_test(test_port_numa),
      cmocka_unit_test(test_net_ib_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
