/*
 * The verbs emulation itself (tests/common/fakeverbs), through the verbs
 * API as the IB transport will call it: RC QPs across two processes
 * (RDMA write, write with immediate into a posted receive, in order, a
 * completion channel whose fd really wakes poll()), the state machine,
 * and every fault a NIC reports: a write outside the peer's region
 * (remote access error, then the QP's later requests flushed), a bad local
 * key, a peer that vanished (retry exceeded), and the injected ones
 * (FAKEVERBS_FAULT: retry, rnr, fatal async event). Linked straight to
 * build/tests/fakeverbs/libibverbs.so.1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define BUF_BYTES (1u << 20)
#define WAIT_MS 5000

/* One side: a context on the emulated HCA's port 1 and its objects. */
struct ep {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_comp_channel* ch;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  char* buf;
};

/* What the other side needs: as the transport's blob will carry it. */
struct ep_addr {
  uint32_t qpn;
  uint16_t lid;
  uint64_t addr;
  uint32_t rkey;
};

static void ep_open(struct ep* e) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  assert_true(list != NULL && n >= 1);
  e->ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  assert_non_null(e->ctx);
  e->pd = ibv_alloc_pd(e->ctx);
  e->ch = ibv_create_comp_channel(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 256, e, e->ch, 0);
  e->buf = calloc(1, BUF_BYTES);
  e->mr = ibv_reg_mr(e->pd, e->buf, BUF_BYTES,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  struct ibv_qp_init_attr ia = {
      .send_cq = e->cq,
      .recv_cq = e->cq,
      .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC};
  e->qp = ibv_create_qp(e->pd, &ia);
  assert_true(e->pd && e->ch && e->cq && e->buf && e->mr && e->qp);
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  assert_int_equal(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
}

static struct ep_addr ep_addr_of(const struct ep* e) {
  struct ibv_port_attr pa;
  assert_int_equal(ibv_query_port(e->ctx, 1, &pa), 0);
  return (struct ep_addr){e->qp->qp_num, pa.lid, (uint64_t)(uintptr_t)e->buf, e->mr->rkey};
}

/* INIT -> RTR (to the peer) -> RTS. */
static void ep_connect(struct ep* e, const struct ep_addr* peer) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = IBV_MTU_4096,
                          .dest_qp_num = peer->qpn,
                          .ah_attr = {.dlid = peer->lid, .port_num = 1}};
  assert_int_equal(
      ibv_modify_qp(e->qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
      0);
  a.qp_state = IBV_QPS_RTS;
  assert_int_equal(ibv_modify_qp(e->qp, &a, IBV_QP_STATE), 0);
}

static void ep_close(struct ep* e) {
  ibv_destroy_qp(e->qp);
  ibv_dereg_mr(e->mr);
  ibv_destroy_cq(e->cq);
  ibv_destroy_comp_channel(e->ch);
  ibv_dealloc_pd(e->pd);
  ibv_close_device(e->ctx);
  free(e->buf);
}

static int post_write(struct ep* e, uint64_t wr_id, size_t off, size_t len,
                      const struct ep_addr* to, size_t roff, int imm, uint32_t value) {
  struct ibv_sge sge = {(uint64_t)(uintptr_t)(e->buf + off), (uint32_t)len, e->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id,
                           .sg_list = &sge,
                           .num_sge = len ? 1 : 0,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED,
                           .imm_data = value};
  struct ibv_send_wr* bad = NULL;
  wr.wr.rdma.remote_addr = to->addr + roff;
  wr.wr.rdma.rkey = to->rkey;
  return ibv_post_send(e->qp, &wr, &bad);
}

static void post_recv(struct ep* e, uint64_t wr_id) {
  struct ibv_recv_wr wr = {.wr_id = wr_id}, *bad = NULL;
  assert_int_equal(ibv_post_recv(e->qp, &wr, &bad), 0);
}

/* The next completion, sleeping on the channel as the progress engine
 * will: poll once, arm, poll again, then wait for the fd. */
static int next_wc(struct ep* e, struct ibv_wc* wc) {
  for (;;) {
    if (ibv_poll_cq(e->cq, 1, wc) == 1) return 0;
    ibv_req_notify_cq(e->cq, 0);
    if (ibv_poll_cq(e->cq, 1, wc) == 1) return 0;
    struct pollfd p = {e->ch->fd, POLLIN, 0};
    if (poll(&p, 1, WAIT_MS) != 1) return -1;
    struct ibv_cq* cq;
    void* cq_ctx;
    if (ibv_get_cq_event(e->ch, &cq, &cq_ctx) != 0 || cq != e->cq || cq_ctx != e) return -1;
    ibv_ack_cq_events(cq, 1);
  }
}

static void setup_env(void) {
  setenv("FAKEVERBS_HCAS", "mlx5_0:1", 1);
  unsetenv("FAKEVERBS_FAULT");
}

/* ---- Across processes ---- */

#define NWRITES 40

/* The child writes NWRITES pieces in order, each a write followed by a
 * write with immediate naming it; the parent checks every byte and the
 * immediates' order, woken by the channel. */
static void test_two_processes(void** state) {
  (void)state;
  int up[2], down[2];
  setup_env();
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  pid_t c = fork();
  if (c == 0) {
    struct ep e;
    struct ep_addr mine, peer;
    ep_open(&e);
    mine = ep_addr_of(&e);
    if (write(up[1], &mine, sizeof(mine)) != sizeof(mine) ||
        read(down[0], &peer, sizeof(peer)) != sizeof(peer))
      _exit(2);
    ep_connect(&e, &peer);
    size_t piece = BUF_BYTES / NWRITES / 2;
    uint64_t done = 0;
    for (int i = 0; i < NWRITES; i++) {
      for (size_t k = 0; k < piece; k++) e.buf[i * piece + k] = (char)(i * 7 + k);
      if (post_write(&e, 2 * (uint64_t)i, i * piece, piece / 2, &peer, i * piece, 0, 0) ||
          post_write(&e, 2 * (uint64_t)i + 1, i * piece + piece / 2, piece - piece / 2, &peer,
                     i * piece + piece / 2, 1, htonl((uint32_t)i)))
        _exit(3);
      /* reap in order, keeping the send queue (64) from filling */
      for (; done < 2 * (uint64_t)i + 2 && (2 * (uint64_t)i + 2 - done > 32 || i == NWRITES - 1);
           done++) {
        struct ibv_wc wc;
        if (next_wc(&e, &wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != done) _exit(4);
      }
    }
    if (read(down[0], &peer, 1) != 1) _exit(5); /* the parent is done with our data */
    ep_close(&e);
    _exit(0);
  }
  struct ep e;
  struct ep_addr mine, peer;
  ep_open(&e);
  for (int i = 0; i < NWRITES; i++) post_recv(&e, 1000 + (uint64_t)i);
  mine = ep_addr_of(&e);
  assert_int_equal(read(up[0], &peer, sizeof(peer)), sizeof(peer));
  assert_int_equal(write(down[1], &mine, sizeof(mine)), sizeof(mine));
  ep_connect(&e, &peer);
  size_t piece = BUF_BYTES / NWRITES / 2;
  for (int i = 0; i < NWRITES; i++) {
    struct ibv_wc wc;
    assert_int_equal(next_wc(&e, &wc), 0);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_true(wc.wc_flags & IBV_WC_WITH_IMM);
    assert_int_equal(ntohl(wc.imm_data), i); /* in order */
    assert_int_equal(wc.wr_id, 1000 + (uint64_t)i);
    assert_int_equal(wc.byte_len, piece - piece / 2);
    for (size_t k = 0; k < piece; k++) /* the plain write before it landed first */
      if (e.buf[i * piece + k] != (char)(i * 7 + k)) fail_msg("piece %d byte %zu wrong", i, k);
  }
  assert_int_equal(write(down[1], "x", 1), 1);
  int st;
  assert_int_equal(waitpid(c, &st, 0), c);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ep_close(&e);
}

/* ---- One process, two QPs ---- */

static void pair_open(struct ep* a, struct ep* b, struct ep_addr* to_b) {
  struct ep_addr aa, ba;
  ep_open(a);
  ep_open(b);
  aa = ep_addr_of(a);
  ba = ep_addr_of(b);
  ep_connect(a, &ba);
  ep_connect(b, &aa);
  *to_b = ba;
}

static void pair_close(struct ep* a, struct ep* b) {
  ep_close(a);
  ep_close(b);
}

/* A write past the peer's region fails like hardware: remote access
 * error, the QP in error, the request after it flushed; the peer's memory
 * untouched. A bad local key: local protection error. */
static void test_access_errors(void** state) {
  (void)state;
  struct ep a, b;
  struct ep_addr to_b;
  struct ibv_wc wc;
  setup_env();
  pair_open(&a, &b, &to_b);
  memset(a.buf, 0x5a, BUF_BYTES);
  assert_int_equal(post_write(&a, 1, 0, 4096, &to_b, BUF_BYTES - 100, 0, 0), 0);
  assert_int_equal(post_write(&a, 2, 0, 16, &to_b, 0, 0, 0), 0);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_int_equal(wc.wr_id, 1);
  assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_int_equal(wc.wr_id, 2);
  assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(a.qp->state, IBV_QPS_ERR);
  assert_int_equal(b.buf[BUF_BYTES - 100], 0);
  assert_int_equal(b.buf[0], 0);
  pair_close(&a, &b);

  pair_open(&a, &b, &to_b);
  struct ibv_sge sge = {(uint64_t)(uintptr_t)a.buf, 64, a.mr->lkey + 77};
  struct ibv_send_wr wr = {.wr_id = 9,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr* bad = NULL;
  wr.wr.rdma.remote_addr = to_b.addr;
  wr.wr.rdma.rkey = to_b.rkey;
  assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_int_equal(wc.status, IBV_WC_LOC_PROT_ERR);
  pair_close(&a, &b);
}

/* Posting before RTS is refused; RESET -> RTR is not a transition. */
static void test_state_machine(void** state) {
  (void)state;
  struct ep a;
  struct ep_addr self;
  setup_env();
  ep_open(&a);
  self = ep_addr_of(&a);
  assert_int_not_equal(post_write(&a, 1, 0, 8, &self, 0, 0, 0), 0);
  struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
  assert_int_equal(ibv_modify_qp(a.qp, &r, IBV_QP_STATE), 0);
  struct ibv_qp_attr bad = {.qp_state = IBV_QPS_RTR, .dest_qp_num = self.qpn};
  assert_int_equal(ibv_modify_qp(a.qp, &bad, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN), EINVAL);
  ep_close(&a);
}

/* The peer's QP destroyed: the next request fails with retry exceeded. */
static void test_peer_gone(void** state) {
  (void)state;
  struct ep a, b;
  struct ep_addr to_b;
  struct ibv_wc wc;
  setup_env();
  pair_open(&a, &b, &to_b);
  ep_close(&b);
  usleep(100000); /* the HCA sees the connection close */
  post_write(&a, 5, 0, 64, &to_b, 0, 0, 0);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
  ep_close(&a);
}

/* FAKEVERBS_FAULT: the 2nd request is never acknowledged (retry
 * exceeded, after the 1st succeeded); a write with immediate and no
 * receive posted (rnr); a device fatal event on the context's async fd. */
static void test_injected_faults(void** state) {
  (void)state;
  struct ep a, b;
  struct ep_addr to_b;
  struct ibv_wc wc;
  struct ibv_async_event ev;
  setup_env();
  setenv("FAKEVERBS_FAULT", "retry:2,rnr:1,fatal:3", 1);
  pair_open(&a, &b, &to_b);
  assert_int_equal(post_write(&a, 1, 0, 64, &to_b, 0, 0, 0), 0);
  assert_int_equal(post_write(&a, 2, 0, 64, &to_b, 0, 0, 0), 0);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_true(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_true(wc.wr_id == 2 && wc.status == IBV_WC_RETRY_EXC_ERR);
  pair_close(&a, &b);
  pair_open(&a, &b, &to_b);
  assert_int_equal(post_write(&a, 3, 0, 64, &to_b, 0, 1, 7), 0); /* no receive at b */
  assert_int_equal(next_wc(&a, &wc), 0);
  assert_true(wc.wr_id == 3 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
  struct pollfd p = {a.ctx->async_fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, WAIT_MS), 1); /* the 3rd request posted raised it */
  assert_int_equal(ibv_get_async_event(a.ctx, &ev), 0);
  assert_int_equal(ev.event_type, IBV_EVENT_DEVICE_FATAL);
  ibv_ack_async_event(&ev);
  pair_close(&a, &b);
  unsetenv("FAKEVERBS_FAULT");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_processes),   cmocka_unit_test(test_access_errors),
      cmocka_unit_test(test_state_machine),   cmocka_unit_test(test_peer_gone),
      cmocka_unit_test(test_injected_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
