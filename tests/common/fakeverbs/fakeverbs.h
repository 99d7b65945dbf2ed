/*
 * The verbs emulation's parts (tests/common/fakeverbs): devices and ports
 * (fakeverbs.c), protection domains and memory regions (fv_mem.c),
 * completion queues, channels and async events (fv_cq.c), RC queue pairs
 * and their wire (fv_qp.c), and the "HCA": one thread per process that
 * carries out what peers send (fv_hw.c).
 *
 * The wire: each QP listens on an abstract Unix stream socket named by its
 * QP number (which holds the pid, so QPs of all processes on the host
 * differ); at RTR it connects to its destination's. Requests (RDMA write,
 * write with immediate, send) go out on a QP's own connection, written by
 * the poster; the destination's HCA thread checks the rkey and bounds,
 * writes the payload into its process's memory, completes a receive where
 * the request consumes one, and acknowledges on the same connection; the
 * requester's HCA thread completes the send. Delivery is in order: one
 * stream per QP and direction.
 */
#ifndef FAKEVERBS_H_
#define FAKEVERBS_H_

#include <pthread.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#define FV_EXPORT __attribute__((visibility("default")))

struct fv_hca {
  struct ibv_device dev; /* first: the library's handle is its address */
  int nports;
  int eth;
};

struct fv_context {
  struct ibv_context ctx;
  struct fv_hca* hca;
  int async_wfd; /* async events are written here, read from ctx.async_fd */
};

/* Whether the context's HCA is RoCE (its QPs need a global route). */
int fv_context_is_eth(struct ibv_context* ctx);

/* One lock for the emulation's tables and queues (the HCA thread and the
 * verbs calls): a test's rates do not need finer. */
extern pthread_mutex_t fv_lock;

/* ---- memory (fv_mem.c) ---- */
/* The region `key` names, if [addr, addr+len) lies inside it and it grants
 * `access` (0: local use); else NULL. Under fv_lock. */
struct ibv_mr* fv_mr_check(uint32_t key, uint64_t addr, uint64_t len, int access);

/* ---- completions (fv_cq.c) ---- */
/* Append wc to cq (waking its channel if armed); under fv_lock. -1 when
 * the CQ overflows (an async CQ error is raised). */
int fv_cq_push(struct ibv_cq* cq, const struct ibv_wc* wc);
void fv_async_raise(struct ibv_context* ctx, enum ibv_event_type type, struct ibv_qp* qp);

/* ---- faults (fv_hw.c): FAKEVERBS_FAULT=kind:n[,kind:n] ---- */
enum fv_fault { FV_FAULT_ACCESS, FV_FAULT_RETRY, FV_FAULT_FATAL, FV_FAULT_RNR, FV_FAULT_COUNT };
/* Whether the fault of `kind` fires on this event (the n-th of its kind). */
int fv_fault_now(enum fv_fault kind);
/* FAKEVERBS_DELAY_US: the HCA's pause before carrying out a request. */
void fv_delay(void);

/* ---- queue pairs (fv_qp.c) and the HCA thread (fv_hw.c) ---- */
struct fv_qp;
/* Start the HCA thread if it is not running; watch fd for `qp` (what:
 * FV_FD_LISTEN, FV_FD_IN, FV_FD_OUT). */
enum fv_fd_kind { FV_FD_LISTEN = 1, FV_FD_IN, FV_FD_OUT };
int fv_hw_watch(struct fv_qp* qp, int fd, enum fv_fd_kind what);
/* Stop watching fd (the HCA thread, under fv_lock). */
void fv_hw_unwatch(int fd);
/* CPU time of the HCA thread so far, ns (0: not started). */
uint64_t fv_hw_cpu_ns(void);
/* The HCA's handling of an event on one of qp's fds (under fv_lock). */
void fv_qp_event(struct fv_qp* qp, int fd, enum fv_fd_kind what);
/* The QP behind a watched handle, or NULL once destroyed (under fv_lock). */
struct fv_qp* fv_qp_lookup(uint32_t qpn);

/* Frames on the wire. */
enum fv_frame_type { FV_REQ_WRITE = 1, FV_REQ_WRITE_IMM, FV_REQ_SEND, FV_ACK, FV_HELLO };
struct fv_frame {
  uint32_t type;
  uint32_t status; /* FV_ACK: an ibv_wc_status */
  uint32_t imm;
  uint32_t rkey;
  uint64_t raddr;
  uint64_t len; /* payload bytes that follow a request */
  uint64_t psn; /* requests, numbered per QP; an ACK names the one it answers */
};

/* Whole frames over a blocking stream socket: 0, or -1 (closed, error). */
int fv_write_all(int fd, const void* buf, size_t len);
int fv_read_all(int fd, void* buf, size_t len);

#endif /* FAKEVERBS_H_ */
