/*
 * The IB transport's QP setup and GID choice (transports/ib/ib_qp.c,
 * ib_gid.c): the rules on GIDs as data, then through libibverbs opened at
 * run time against the verbs emulation (children started with it): two
 * QPs taken INIT -> RTR -> RTS by ib_qp_connect on an InfiniBand port and
 * on a RoCE port (the emulation refuses a RoCE route without a GID, and
 * knob values outside their fields), the knobs NCCL_IB_TIMEOUT,
 * NCCL_IB_RETRY_CNT, NCCL_IB_SL and NCCL_IB_TC applied, an RDMA write with
 * immediate through them; the GID index by NCCL_IB_GID_INDEX,
 * NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_FAMILY and NCCL_IB_ADDR_RANGE.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ib/ib_devices.h"
#include "ib/ib_gdr.h"
#include "ib/ib_gid.h"
#include "ib/ib_qp.h"

static const char* g_self;

/* ---- GIDs as data ---- */

static union ibv_gid gid_v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  union ibv_gid g;
  memset(&g, 0, sizeof(g));
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = a, g.raw[13] = b, g.raw[14] = c, g.raw[15] = d;
  return g;
}

static union ibv_gid gid_v6(uint8_t first, uint8_t last) {
  union ibv_gid g;
  memset(&g, 0, sizeof(g));
  g.raw[0] = first, g.raw[15] = last;
  return g;
}

static void test_gid_rules(void** state) {
  (void)state;
  union ibv_gid t[5] = {gid_v6(0xfe, 1), gid_v4(10, 0, 1, 1), gid_v4(10, 0, 1, 1), gid_v6(0xfd, 2),
                        gid_v4(192, 168, 3, 4)};
  int ver[5] = {1, 1, 2, 2, 2};
  t[0].raw[1] = 0x80; /* fe80::1, link-local */
  assert_int_equal(ib_gid_family(&t[0]), 0);
  assert_int_equal(ib_gid_family(&t[1]), AF_INET);
  assert_int_equal(ib_gid_family(&t[3]), AF_INET6);
  assert_int_equal(ib_gid_in_range(&t[1], "10.0.0.0/8"), 1);
  assert_int_equal(ib_gid_in_range(&t[1], "10.1.0.0/16"), 0);
  assert_int_equal(ib_gid_in_range(&t[3], "fd00::/8"), 1);
  assert_int_equal(ib_gid_in_range(&t[3], "10.0.0.0/8"), 0); /* another family */
  assert_int_equal(ib_gid_in_range(&t[1], "10.0.0.0"), -1);
  assert_int_equal(ib_gid_in_range(&t[1], "10.0.0.0/40"), -1);
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET, NULL, 2), 2);
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET, NULL, 1), 1);
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET6, NULL, 2), 3);
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET, "192.168.0.0/16", 2), 4);
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET, "172.16.0.0/12", 2), -1);
  ver[2] = 1; /* no v2 IPv4 GID in 10/8: the v1 one */
  assert_int_equal(ib_gid_pick(t, ver, 5, AF_INET, "10.0.0.0/8", 2), 1);
}

/* ---- Through the emulation (in a child) ---- */

typedef int (*query_qp_fn)(struct ibv_qp*, struct ibv_qp_attr*, int, struct ibv_qp_init_attr*);

/* One end: a QP on the first port found, and its info. */
struct end {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_mr* mr;
  struct ibv_qp* qp;
  struct ib_qp_info info;
  char buf[4096];
};

static int end_open(const struct ib_verbs* v, const struct ib_port* p, struct end* e) {
  struct ibv_device** list = v->get_device_list(NULL);
  struct ibv_port_attr pa;
  e->ctx = list ? v->open_device(list[0]) : NULL;
  if (list) v->free_device_list(list);
  if (e->ctx == NULL || v->query_port(e->ctx, (uint8_t)p->port, &pa) != 0) return 1;
  e->pd = v->alloc_pd(e->ctx);
  e->cq = v->create_cq(e->ctx, 64, NULL, NULL, 0);
  e->mr =
      v->reg_mr(e->pd, e->buf, sizeof(e->buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!e->pd || !e->cq || !e->mr || ib_qp_create(v, e->pd, e->cq, p->port, 16, &e->qp)) return 1;
  memset(&e->info, 0, sizeof(e->info));
  e->info.qpn = e->qp->qp_num;
  e->info.lid = pa.lid;
  e->info.link_layer = pa.link_layer;
  e->info.mtu = pa.active_mtu;
  if (ib_gid_select(v, e->ctx, p->port, pa.link_layer, pa.gid_tbl_len, &e->info.gid_index,
                    &e->info.gid) != ncclSuccess)
    return 2;
  return 0;
}

/* a writes 64 bytes with immediate 0x77 into b; b's receive completes. */
static int write_through(struct end* a, struct end* b) {
  struct ibv_recv_wr rwr = {.wr_id = 1}, *rbad;
  struct ibv_sge sge = {(uint64_t)(uintptr_t)a->buf, 64, a->mr->lkey};
  struct ibv_send_wr swr = {.wr_id = 2,
                            .sg_list = &sge,
                            .num_sge = 1,
                            .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                            .send_flags = IBV_SEND_SIGNALED,
                            .imm_data = 0x77},
                     *sbad;
  struct ibv_wc wc;
  swr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)b->buf;
  swr.wr.rdma.rkey = b->mr->rkey;
  memset(a->buf, 0x3c, 64);
  if (ibv_post_recv(b->qp, &rwr, &rbad) || ibv_post_send(a->qp, &swr, &sbad)) return 1;
  for (int got = 0, spins = 0; got < 2 && spins < 5000000; spins++) {
    if (ibv_poll_cq(a->cq, 1, &wc) == 1) got += wc.status == IBV_WC_SUCCESS ? 1 : 100;
    if (ibv_poll_cq(b->cq, 1, &wc) == 1)
      got += wc.status == IBV_WC_SUCCESS && wc.imm_data == 0x77 ? 1 : 100;
    if (got >= 2) return got != 2 || b->buf[63] != 0x3c;
  }
  return 1;
}

/* In the child: two QPs connected by ib_qp_connect; prints the GID index,
 * the QP attributes the knobs set, and whether a write went through. */
static int child_qp(void) {
  const char* why;
  const struct ib_verbs* v = ib_verbs_get(&why);
  struct ib_port ports[4];
  struct ib_qp_knobs k;
  struct end a, b;
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  int n = 0, nhca = 0;
  if (v == NULL) return printf("no verbs: %s\n", why), 1;
  ib_ports_find(v, NULL, ports, 4, &n, &nhca);
  if (n == 0) return printf("no port\n"), 1;
  int rc = end_open(v, &ports[0], &a);
  if (rc == 0) rc = end_open(v, &ports[0], &b);
  if (rc) return printf("open failed %d: %s\n", rc, ncclGetLastError(NULL)), 0;
  ib_qp_knobs_read(&k);
  if (ib_qp_connect(v, a.qp, ports[0].port, &a.info, &b.info, &k) != ncclSuccess ||
      ib_qp_connect(v, b.qp, ports[0].port, &b.info, &a.info, &k) != ncclSuccess)
    return printf("connect failed: %s\n", ncclGetLastError(NULL)), 0;
  query_qp_fn query = (query_qp_fn)dlsym(dlopen("libibverbs.so.1", RTLD_NOW), "ibv_query_qp");
  if (query == NULL || query(a.qp, &qa, 0, &qi) != 0) return printf("no query\n"), 1;
  printf("gid %d timeout %d retry %d sl %d tc %d global %d write %s\n", a.info.gid_index,
         qa.timeout, qa.retry_cnt, qa.ah_attr.sl, qa.ah_attr.grh.traffic_class,
         qa.ah_attr.is_global, write_through(&a, &b) ? "FAILED" : "ok");
  return 0;
}

static void run_child(const char* const* env, char* out, size_t len) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    setenv("LD_LIBRARY_PATH", "build/tests/fakeverbs", 1);
    for (int i = 0; env && env[i]; i++) putenv((char*)env[i]);
    execl(g_self, g_self, "qp", (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], out, len - 1);
  out[got > 0 ? got : 0] = '\0';
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  printf("  %s", out);
}

static void test_qp_infiniband(void** state) {
  (void)state;
  char out[512];
  const char* const ib[] = {"FAKEVERBS_HCAS=mlx5_0:1", NULL};
  run_child(ib, out, sizeof(out));
  assert_non_null(strstr(out, "gid 0 timeout 20 retry 7 sl 0 tc 0 global 0 write ok"));
  const char* const knobs[] = {"FAKEVERBS_HCAS=mlx5_0:1", "NCCL_IB_TIMEOUT=14",
                               "NCCL_IB_RETRY_CNT=5", "NCCL_IB_SL=3", NULL};
  run_child(knobs, out, sizeof(out));
  assert_non_null(strstr(out, "timeout 14 retry 5 sl 3 tc 0 global 0 write ok"));
}

/* The RoCE port's GID types, as sysfs shows them. */
static void roce_sysfs(void) {
  static const char* const types[4] = {"IB/RoCE v1", "IB/RoCE v1", "RoCE v2", "RoCE v2"};
  char path[256];
  const char* dirs[] = {"/tmp/braid_fv_gid",
                        "/tmp/braid_fv_gid/roce0",
                        "/tmp/braid_fv_gid/roce0/ports",
                        "/tmp/braid_fv_gid/roce0/ports/1",
                        "/tmp/braid_fv_gid/roce0/ports/1/gid_attrs",
                        "/tmp/braid_fv_gid/roce0/ports/1/gid_attrs/types"};
  for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) mkdir(dirs[i], 0755);
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof(path), "/tmp/braid_fv_gid/roce0/ports/1/gid_attrs/types/%d", i);
    FILE* f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", types[i]);
    fclose(f);
  }
}

#define ROCE "FAKEVERBS_HCAS=roce0:1:eth", "FAKEVERBS_SYSFS=/tmp/braid_fv_gid"

static void test_qp_roce(void** state) {
  (void)state;
  char out[512];
  roce_sysfs();
  const char* const dflt[] = {ROCE, "NCCL_IB_TC=106", NULL};
  run_child(dflt, out, sizeof(out));
  assert_non_null(strstr(out, "gid 2 timeout 20 retry 7 sl 0 tc 106 global 1 write ok"));
  const char* const v1[] = {ROCE, "NCCL_IB_ROCE_VERSION_NUM=1", NULL};
  run_child(v1, out, sizeof(out));
  assert_non_null(strstr(out, "gid 1 "));
  const char* const v6[] = {ROCE, "NCCL_IB_ADDR_FAMILY=AF_INET6", NULL};
  run_child(v6, out, sizeof(out));
  assert_non_null(strstr(out, "gid 3 "));
  const char* const in[] = {ROCE, "NCCL_IB_ADDR_RANGE=10.0.1.0/24", NULL};
  run_child(in, out, sizeof(out));
  assert_non_null(strstr(out, "gid 2 "));
  const char* const out_of[] = {ROCE, "NCCL_IB_ADDR_RANGE=192.168.0.0/16", NULL};
  run_child(out_of, out, sizeof(out));
  assert_non_null(strstr(out, "no IPv4 GID in 192.168.0.0/16"));
  const char* const forced[] = {ROCE, "NCCL_IB_GID_INDEX=3", NULL};
  run_child(forced, out, sizeof(out));
  assert_non_null(strstr(out, "gid 3 "));
  const char* const link_local[] = {ROCE, "NCCL_IB_GID_INDEX=0", NULL}; /* no route: refused */
  run_child(link_local, out, sizeof(out));
  assert_non_null(strstr(out, "connect failed"));
}

/* GPUDirect RDMA's kernel module, as NCCL looks for it. */
static void test_gdr_probe(void** state) {
  (void)state;
  char root[] = "/tmp/braid_gdr.XXXXXX", path[256];
  assert_non_null(mkdtemp(root));
  assert_null(ib_gdr_module(root));
  snprintf(path, sizeof(path), "%s/sys", root);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/sys/module", root);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/sys/module/nvidia_peermem", root);
  mkdir(path, 0755);
  assert_string_equal(ib_gdr_module(root), "nvidia_peermem");
  rmdir(path);
  snprintf(path, sizeof(path), "%s/sys/module", root);
  rmdir(path);
  snprintf(path, sizeof(path), "%s/sys", root);
  rmdir(path);
  rmdir(root);
}

int main(int argc, char** argv) {
  g_self = argv[0];
  if (argc > 1 && strcmp(argv[1], "qp") == 0) return child_qp();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gid_rules),
      cmocka_unit_test(test_gdr_probe),
      cmocka_unit_test(test_qp_infiniband),
      cmocka_unit_test(test_qp_roce),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
