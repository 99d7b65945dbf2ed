/*
 * RC queue pairs of the verbs emulation (fakeverbs.h has the wire). The
 * poster writes a request and its payload on the QP's connection; the
 * target's HCA thread carries it out and acknowledges; the requester's
 * HCA thread completes the work request. A QP in error flushes what it
 * holds; a peer that vanished fails what was outstanding with "retry
 * exceeded", as a NIC's transport timer would.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fakeverbs.h"

#define FV_MAX_QPS 1024

struct fv_swr {
  uint64_t wr_id;
  uint64_t psn;
  uint32_t len;
  int signaled;
  enum ibv_wc_opcode opcode;
  enum ibv_wc_status fails; /* not sent: it fails with this once it is the oldest */
};

struct fv_rwr {
  uint64_t wr_id;
  struct ibv_sge sge; /* length 0: none */
};

/* A request that needs a receive and found none yet (a send's payload
 * kept until one comes). */
struct fv_held {
  struct fv_frame f;
  void* payload;
};

struct fv_qp {
  struct ibv_qp qp;
  struct ibv_qp_attr applied; /* what modify_qp set, for ibv_query_qp */
  int listen_fd, in_fd, out_fd;
  int gone_fd;               /* out_fd once the peer vanished: shut, closed with the QP */
  pthread_mutex_t send_lock; /* one poster's frame at a time on out_fd */
  uint64_t next_psn;
  struct fv_swr* sq;
  int sq_cap, sq_head, sq_count;
  struct fv_rwr* rq;
  int rq_cap, rq_head, rq_count;
  struct fv_held* held;
  int held_head, held_count;
  int stalled;     /* a request was lost: none after it goes out (RC delivers in order) */
  uint64_t writes; /* RDMA writes it put on the wire, for fakeverbs_qps_writing */
  /* the responder refused a request (receiver not ready) for good: the
   * later ones of the stream are out of sequence and dropped, as a NIC's
   * responder drops packets past the one it NAKed (the requester fails) */
  int refused;
};

static struct fv_qp* g_qps[FV_MAX_QPS];
static uint64_t g_sent_requests, g_sent_bytes; /* what this process put on the wire */

uint32_t fv_qp_num(const struct fv_qp* qp) {
  return qp->qp.qp_num;
}

struct fv_qp* fv_qp_lookup(uint32_t qpn) {
  struct fv_qp* q = g_qps[qpn % FV_MAX_QPS];
  return q && q->qp.qp_num == qpn ? q : NULL;
}

/* The "fabric": a directory of QP sockets, FAKEVERBS_FABRIC or
 * /tmp/fakeverbs-fabric. Named in the file system, not abstract, so that
 * processes in different network namespaces (the emulated cluster's
 * hosts) reach each other, as hosts on one fabric do. */
static socklen_t qp_addr(uint32_t qpn, struct sockaddr_un* a) {
  const char* dir = getenv("FAKEVERBS_FABRIC");
  if (dir == NULL || *dir == '\0') dir = "/tmp/fakeverbs-fabric";
  mkdir(dir, 0777);
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  snprintf(a->sun_path, sizeof(a->sun_path), "%s/qp-%06x", dir, qpn);
  return (socklen_t)sizeof(*a);
}

/* ---- Completions and errors (under fv_lock) ---- */

static void complete(struct ibv_cq* cq, struct fv_qp* q, uint64_t wr_id, enum ibv_wc_status st,
                     enum ibv_wc_opcode op, uint32_t len, uint32_t imm, unsigned flags) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof(wc));
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = len;
  wc.imm_data = imm;
  wc.wc_flags = flags;
  wc.qp_num = q->qp.qp_num;
  fv_cq_push(cq, &wc);
}

/* The QP goes to error: what it holds completes flushed. */
static void qp_error(struct fv_qp* q) {
  q->qp.state = IBV_QPS_ERR;
  for (; q->sq_count > 0; q->sq_count--, q->sq_head = (q->sq_head + 1) % q->sq_cap) {
    struct fv_swr* w = &q->sq[q->sq_head];
    complete(q->qp.send_cq, q, w->wr_id, IBV_WC_WR_FLUSH_ERR, w->opcode, 0, 0, 0);
  }
  for (; q->rq_count > 0; q->rq_count--, q->rq_head = (q->rq_head + 1) % q->rq_cap)
    complete(q->qp.recv_cq, q, q->rq[q->rq_head].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
}

/* The oldest outstanding request completes with `st` (an error always
 * completes, and takes the QP to error). */
static void send_done(struct fv_qp* q, enum ibv_wc_status st) {
  struct fv_swr* w = &q->sq[q->sq_head];
  q->sq_head = (q->sq_head + 1) % q->sq_cap;
  q->sq_count--;
  if (st != IBV_WC_SUCCESS || w->signaled)
    complete(q->qp.send_cq, q, w->wr_id, st, w->opcode, w->len, 0, 0);
  if (st != IBV_WC_SUCCESS)
    qp_error(q);
  else if (q->sq_count > 0 && q->sq[q->sq_head].fails != IBV_WC_SUCCESS)
    send_done(q, q->sq[q->sq_head].fails); /* a request that never went: its turn to fail */
}

/* ---- Verbs ---- */

/* For tests (not a verb): how many of this process's live QPs have put
 * an RDMA write on the wire (a connection striping its messages uses all
 * of its QPs). */
FV_EXPORT int fakeverbs_qps_writing(void) {
  int n = 0;
  pthread_mutex_lock(&fv_lock);
  for (int i = 0; i < FV_MAX_QPS; i++) n += g_qps[i] && g_qps[i]->writes > 0;
  pthread_mutex_unlock(&fv_lock);
  return n;
}

/* FAKEVERBS_STATS=file: one line per process at exit, "pid requests
 * bytes hca_cpu_ns": the requests (writes, writes with immediate, sends)
 * it put on the wire, their payload, and the CPU time of its HCA thread,
 * for the benchmark report. */
static void stats_write(void) {
  const char* path = getenv("FAKEVERBS_STATS");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f == NULL) return;
  fprintf(f, "%d %llu %llu %llu\n", (int)getpid(), (unsigned long long)g_sent_requests,
          (unsigned long long)g_sent_bytes, (unsigned long long)fv_hw_cpu_ns());
  fclose(f);
}

/* A process that exits with QPs left (an abort, a test's child) takes
 * their socket files along; one killed leaves them, and the next QP of
 * that number unlinks it. */
static void qp_files_remove(void) {
  struct sockaddr_un a;
  stats_write();
  for (int i = 0; i < FV_MAX_QPS; i++)
    if (g_qps[i]) {
      qp_addr(g_qps[i]->qp.qp_num, &a);
      unlink(a.sun_path);
    }
}

FV_EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* attr) {
  struct fv_qp* q = calloc(1, sizeof(*q));
  struct sockaddr_un a;
  static uint32_t next;
  if (q == NULL || attr->qp_type != IBV_QPT_RC) goto fail;
  q->sq_cap = (int)attr->cap.max_send_wr + 1;
  q->rq_cap = (int)attr->cap.max_recv_wr + 1;
  q->sq = calloc((size_t)q->sq_cap, sizeof(*q->sq));
  q->rq = calloc((size_t)q->rq_cap, sizeof(*q->rq));
  q->held = calloc((size_t)q->rq_cap, sizeof(*q->held));
  q->in_fd = q->out_fd = q->gone_fd = -1;
  q->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (q->sq == NULL || q->rq == NULL || q->held == NULL || q->listen_fd < 0) goto fail;
  pthread_mutex_init(&q->send_lock, NULL);
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.qp_context = attr->qp_context;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.state = IBV_QPS_RESET;
  pthread_mutex_lock(&fv_lock);
  static int at_exit;
  if (!at_exit) at_exit = atexit(qp_files_remove) == 0;
  for (int tries = 0; tries < FV_MAX_QPS && q->qp.qp_num == 0; tries++, next++)
    if (g_qps[next % FV_MAX_QPS] == NULL) /* the pid in the high bits: unique on the host */
      q->qp.qp_num = ((uint32_t)getpid() & 0x3fffu) << 10 | (next % FV_MAX_QPS);
  if (q->qp.qp_num != 0) {
    qp_addr(q->qp.qp_num, &a);
    unlink(a.sun_path); /* left by a process that died holding this number */
  }
  int ok = q->qp.qp_num != 0 &&
           bind(q->listen_fd, (struct sockaddr*)&a, qp_addr(q->qp.qp_num, &a)) == 0 &&
           listen(q->listen_fd, 4) == 0 && fv_hw_watch(q, q->listen_fd, FV_FD_LISTEN) == 0;
  if (ok) g_qps[q->qp.qp_num % FV_MAX_QPS] = q;
  pthread_mutex_unlock(&fv_lock);
  if (ok) return &q->qp;
fail:
  if (q && q->listen_fd >= 0) close(q->listen_fd);
  if (q) free(q->sq), free(q->rq), free(q->held);
  free(q);
  errno = EINVAL;
  return NULL;
}

FV_EXPORT int ibv_destroy_qp(struct ibv_qp* qp) {
  struct fv_qp* q = (struct fv_qp*)qp;
  struct sockaddr_un a;
  qp_addr(qp->qp_num, &a);
  unlink(a.sun_path);
  pthread_mutex_lock(&fv_lock);
  g_qps[qp->qp_num % FV_MAX_QPS] = NULL;
  pthread_mutex_unlock(&fv_lock);
  pthread_mutex_lock(&q->send_lock); /* no poster is writing */
  pthread_mutex_unlock(&q->send_lock);
  if (q->listen_fd >= 0) close(q->listen_fd);
  if (q->in_fd >= 0) close(q->in_fd);
  if (q->out_fd >= 0) close(q->out_fd);
  if (q->gone_fd >= 0) close(q->gone_fd);
  for (int i = 0; i < q->held_count; i++) free(q->held[(q->held_head + i) % q->rq_cap].payload);
  pthread_mutex_destroy(&q->send_lock);
  free(q->sq), free(q->rq), free(q->held);
  free(q);
  return 0;
}

/* RTR: connect to the destination QP and say who we are. A destination
 * that is not there fails later sends (retry exceeded), as on a fabric. */
static void qp_connect(struct fv_qp* q, uint32_t dest) {
  struct sockaddr_un a;
  struct fv_frame hello = {.type = FV_HELLO, .psn = q->qp.qp_num};
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  if (connect(s, (struct sockaddr*)&a, qp_addr(dest, &a)) != 0 ||
      fv_write_all(s, &hello, sizeof(hello)) != 0 || fv_hw_watch(q, s, FV_FD_OUT) != 0) {
    close(s);
    return;
  }
  q->out_fd = s;
}

/* RoCE needs a global route from a GID the port has (0..3); InfiniBand
 * a LID. */
static int route_valid(struct ibv_context* ctx, const struct ibv_ah_attr* ah) {
  if (!fv_context_is_eth(ctx)) return ah->dlid != 0;
  return ah->is_global && ah->grh.sgid_index < 4 && ah->grh.sgid_index > 0;
}

static void attr_keep(struct ibv_qp_attr* kept, const struct ibv_qp_attr* a, int mask) {
  kept->qp_state = a->qp_state;
  if (mask & IBV_QP_AV) kept->ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) kept->path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) kept->dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_TIMEOUT) kept->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) kept->retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) kept->rnr_retry = a->rnr_retry;
}

FV_EXPORT int ibv_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask,
                           struct ibv_qp_init_attr* init) {
  (void)mask;
  pthread_mutex_lock(&fv_lock);
  *attr = ((struct fv_qp*)qp)->applied;
  attr->qp_state = qp->state;
  pthread_mutex_unlock(&fv_lock);
  if (init) memset(init, 0, sizeof(*init));
  return 0;
}

#undef ibv_modify_qp
FV_EXPORT int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask) {
  struct fv_qp* q = (struct fv_qp*)qp;
  int rc = 0;
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  pthread_mutex_lock(&fv_lock);
  enum ibv_qp_state from = qp->state, to = attr->qp_state;
  if (to == IBV_QPS_ERR) {
    qp_error(q);
  } else if (to == IBV_QPS_RESET) {
    qp->state = to;
    q->stalled = 0;
  } else if ((from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
             (from == IBV_QPS_RTR && to == IBV_QPS_RTS) || (from == to && from != IBV_QPS_RESET)) {
    qp->state = to;
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    if ((mask & (IBV_QP_DEST_QPN | IBV_QP_AV)) != (IBV_QP_DEST_QPN | IBV_QP_AV) ||
        !route_valid(qp->context, &attr->ah_attr)) {
      rc = EINVAL;
    } else {
      qp_connect(q, attr->dest_qp_num);
      qp->state = to;
    }
  } else {
    rc = EINVAL;
  }
  if (((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) ||
      ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7))
    rc = EINVAL; /* fields of 5 and 3 bits */
  if (rc == 0) attr_keep(&q->applied, attr, mask);
  pthread_mutex_unlock(&fv_lock);
  return rc;
}

/* Queue one request under fv_lock: its number, or an immediate error
 * completion (bad local key, an injected fault, no peer). */
static int send_queue(struct fv_qp* q, const struct ibv_send_wr* wr, uint64_t* psn) {
  uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
  enum ibv_wc_opcode op = wr->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
  if (q->qp.state == IBV_QPS_ERR) { /* as a NIC: flushed, not refused */
    complete(q->qp.send_cq, q, wr->wr_id, IBV_WC_WR_FLUSH_ERR, op, 0, 0, 0);
    return -1;
  }
  if (q->qp.state != IBV_QPS_RTS || wr->num_sge > 1 || q->sq_count == q->sq_cap - 1) return ENOMEM;
  struct fv_swr* w = &q->sq[(q->sq_head + q->sq_count++) % q->sq_cap];
  *w = (struct fv_swr){wr->wr_id, q->next_psn,   len, (wr->send_flags & IBV_SEND_SIGNALED) != 0,
                       op,        IBV_WC_SUCCESS};
  *psn = q->next_psn++;
  if (fv_fault_now(FV_FAULT_FATAL)) fv_async_raise(q->qp.context, IBV_EVENT_DEVICE_FATAL, NULL);
  if (q->stalled)
    w->fails = IBV_WC_WR_FLUSH_ERR; /* behind a lost request: flushed when it fails */
  else if (len && fv_mr_check(wr->sg_list[0].lkey, wr->sg_list[0].addr, len, 0) == NULL)
    w->fails = IBV_WC_LOC_PROT_ERR;
  else if (q->out_fd < 0 || fv_fault_now(FV_FAULT_RETRY))
    w->fails = IBV_WC_RETRY_EXC_ERR; /* never acknowledged */
  if (w->fails == IBV_WC_SUCCESS) return 0;
  q->stalled = 1;
  if (q->sq_count == 1) send_done(q, w->fails); /* else after the requests before it */
  return -1;
}

static uint32_t frame_type(enum ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_WRITE_WITH_IMM ? FV_REQ_WRITE_IMM
         : op == IBV_WR_SEND              ? FV_REQ_SEND
                                          : FV_REQ_WRITE;
}

int fv_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  struct fv_qp* q = (struct fv_qp*)qp;
  for (; wr; wr = wr->next) {
    struct fv_frame f = {.type = frame_type(wr->opcode),
                         .imm = wr->imm_data,
                         .rkey = wr->wr.rdma.rkey,
                         .raddr = wr->wr.rdma.remote_addr,
                         .len = wr->num_sge ? wr->sg_list[0].length : 0};
    pthread_mutex_lock(&q->send_lock);
    pthread_mutex_lock(&fv_lock);
    int rc = send_queue(q, wr, &f.psn);
    int fd = q->out_fd;
    if (rc == 0) g_sent_requests++, g_sent_bytes += f.len, q->writes += f.type != FV_REQ_SEND;
    pthread_mutex_unlock(&fv_lock);
    if (rc == 0 && (fv_write_all(fd, &f, sizeof(f)) != 0 ||
                    (f.len && fv_write_all(fd, (void*)(uintptr_t)wr->sg_list[0].addr, f.len) != 0)))
      rc = -1; /* the peer is gone: its HCA thread sees the closed connection */
    pthread_mutex_unlock(&q->send_lock);
    if (rc > 0) {
      *bad = wr;
      return rc;
    }
  }
  return 0;
}

/* ---- The target's side (the HCA thread, under fv_lock) ---- */

static void ack(struct fv_qp* q, uint64_t psn, enum ibv_wc_status st) {
  struct fv_frame a = {.type = FV_ACK, .status = (uint32_t)st, .psn = psn};
  if (q->in_fd >= 0) fv_write_all(q->in_fd, &a, sizeof(a));
}

/* A request that consumes a receive meets the oldest posted one. */
static void recv_meet(struct fv_qp* q, const struct fv_held* h) {
  struct fv_rwr* r = &q->rq[q->rq_head];
  enum ibv_wc_status st = IBV_WC_SUCCESS;
  q->rq_head = (q->rq_head + 1) % q->rq_cap;
  q->rq_count--;
  if (h->f.type == FV_REQ_SEND) {
    if (h->f.len > r->sge.length || (h->f.len && fv_mr_check(r->sge.lkey, r->sge.addr, h->f.len,
                                                             IBV_ACCESS_LOCAL_WRITE) == NULL))
      st = IBV_WC_LOC_LEN_ERR;
    else if (h->f.len)
      memcpy((void*)(uintptr_t)r->sge.addr, h->payload, h->f.len);
  }
  complete(q->qp.recv_cq, q, r->wr_id, st,
           h->f.type == FV_REQ_SEND ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM, (uint32_t)h->f.len,
           h->f.imm, h->f.type == FV_REQ_WRITE_IMM ? IBV_WC_WITH_IMM : 0);
  ack(q, h->f.psn, st == IBV_WC_SUCCESS ? IBV_WC_SUCCESS : IBV_WC_REM_INV_REQ_ERR);
  free(h->payload);
}

static void held_drain(struct fv_qp* q) {
  while (q->held_count > 0 && q->rq_count > 0) {
    struct fv_held h = q->held[q->held_head];
    q->held_head = (q->held_head + 1) % q->rq_cap;
    q->held_count--;
    recv_meet(q, &h);
  }
}

/* Read a payload into `dst`, or into nowhere (dst NULL). */
static int payload_read(int fd, void* dst, uint64_t len) {
  char sink[4096];
  if (dst) return fv_read_all(fd, dst, len);
  for (uint64_t got = 0; got < len;) {
    size_t n = (size_t)(len - got < sizeof(sink) ? len - got : sizeof(sink));
    if (fv_read_all(fd, sink, n) != 0) return -1;
    got += n;
  }
  return 0;
}

/* A request: a QP in error carries out nothing (its requester's
 * transport times out); an RDMA write outside a region the rkey grants
 * takes the QP to error, as a NIC's responder does. */
static void request(struct fv_qp* q, const struct fv_frame* f) {
  struct fv_held h = {*f, NULL};
  fv_delay();
  if (q->qp.state == IBV_QPS_ERR) {
    if (payload_read(q->in_fd, NULL, f->len) == 0) ack(q, f->psn, IBV_WC_RETRY_EXC_ERR);
    return;
  }
  if (q->refused) {
    payload_read(q->in_fd, NULL, f->len);
    return;
  }
  if (f->type != FV_REQ_SEND) { /* an RDMA write: the rkey decides */
    void* dst = (void*)(uintptr_t)f->raddr;
    int ok = !f->len || fv_mr_check(f->rkey, f->raddr, f->len, IBV_ACCESS_REMOTE_WRITE) != NULL;
    if (fv_fault_now(FV_FAULT_ACCESS)) ok = 0;
    if (payload_read(q->in_fd, ok && f->len ? dst : NULL, f->len) != 0) return;
    if (!ok) {
      ack(q, f->psn, IBV_WC_REM_ACCESS_ERR);
      return qp_error(q);
    }
    if (f->type == FV_REQ_WRITE) return ack(q, f->psn, IBV_WC_SUCCESS);
  } else if (f->len) {
    h.payload = malloc(f->len);
    if (h.payload == NULL || payload_read(q->in_fd, h.payload, f->len) != 0) return free(h.payload);
  }
  if (fv_fault_now(FV_FAULT_RNR) || q->held_count == q->rq_cap) { /* receiver not ready */
    q->refused = 1;
    return free(h.payload), ack(q, f->psn, IBV_WC_RNR_RETRY_EXC_ERR);
  }
  q->held[(q->held_head + q->held_count++) % q->rq_cap] = h;
  held_drain(q);
}

static void accept_peer(struct fv_qp* q) {
  struct fv_frame hello;
  int s = accept4(q->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (s < 0) return;
  if (fv_read_all(s, &hello, sizeof(hello)) != 0 || hello.type != FV_HELLO ||
      fv_hw_watch(q, s, FV_FD_IN) != 0) {
    close(s);
    return;
  }
  if (q->in_fd >= 0) close(q->in_fd);
  q->in_fd = s;
}

/* The peer vanished: outstanding requests fail as the transport timer
 * would, and the QP goes to error. The socket is shut, not closed: a
 * poster may be writing to it outside fv_lock (fv_post_send), and a
 * closed number could name another file by then; the QP closes it. */
static void peer_gone(struct fv_qp* q) {
  fv_hw_unwatch(q->out_fd);
  shutdown(q->out_fd, SHUT_RDWR);
  q->gone_fd = q->out_fd;
  q->out_fd = -1;
  if (q->sq_count > 0) send_done(q, IBV_WC_RETRY_EXC_ERR);
}

void fv_qp_event(struct fv_qp* q, int fd, enum fv_fd_kind what) {
  struct fv_frame f;
  if (what == FV_FD_LISTEN) return accept_peer(q);
  if (what == FV_FD_IN && fd == q->in_fd) {
    if (fv_read_all(fd, &f, sizeof(f)) != 0) {
      close(q->in_fd);
      q->in_fd = -1;
      return;
    }
    return request(q, &f);
  }
  if (what == FV_FD_OUT && fd == q->out_fd) {
    if (fv_read_all(fd, &f, sizeof(f)) != 0 || f.type != FV_ACK) return peer_gone(q);
    if (q->sq_count > 0 && q->sq[q->sq_head].psn == f.psn)
      send_done(q, (enum ibv_wc_status)f.status);
  }
}

int fv_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  struct fv_qp* q = (struct fv_qp*)qp;
  int rc = 0;
  pthread_mutex_lock(&fv_lock);
  for (; wr && rc == 0; wr = wr->next) {
    if (q->qp.state == IBV_QPS_RESET || wr->num_sge > 1 || q->rq_count == q->rq_cap - 1) {
      *bad = wr;
      rc = ENOMEM;
      break;
    }
    struct fv_rwr r = {wr->wr_id, {0, 0, 0}};
    if (wr->num_sge) r.sge = wr->sg_list[0];
    if (q->qp.state == IBV_QPS_ERR) {
      complete(q->qp.recv_cq, q, r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
      continue;
    }
    q->rq[(q->rq_head + q->rq_count++) % q->rq_cap] = r;
  }
  held_drain(q);
  pthread_mutex_unlock(&fv_lock);
  return rc;
}
