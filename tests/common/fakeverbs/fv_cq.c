/*
 * Completion queues, completion channels and async events of the verbs
 * emulation. A channel is a pipe: an armed CQ that gets a completion
 * writes its address there, so the fd really wakes a poll() or an epoll
 * set, and ibv_get_cq_event reads it back. Async events go the same way
 * through the context's pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakeverbs.h"

struct fv_channel {
  struct ibv_comp_channel ch;
  int wfd;
};

struct fv_cq {
  struct ibv_cq cq;
  struct ibv_wc* ring;
  int cap, head, count;
  int armed;
};

FV_EXPORT struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* ctx) {
  struct fv_channel* c = calloc(1, sizeof(*c));
  int fds[2];
  if (c == NULL || pipe2(fds, O_CLOEXEC) != 0) {
    free(c);
    return NULL;
  }
  c->ch.context = ctx;
  c->ch.fd = fds[0];
  c->wfd = fds[1];
  return &c->ch;
}

FV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel* ch) {
  struct fv_channel* c = (struct fv_channel*)ch;
  close(c->ch.fd);
  close(c->wfd);
  free(c);
  return 0;
}

FV_EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* ctx, int cqe, void* cq_context,
                                       struct ibv_comp_channel* channel, int comp_vector) {
  struct fv_cq* c = calloc(1, sizeof(*c));
  (void)comp_vector;
  if (c == NULL || cqe < 1 || (c->ring = calloc((size_t)cqe, sizeof(*c->ring))) == NULL) {
    free(c);
    errno = EINVAL;
    return NULL;
  }
  c->cap = cqe;
  c->cq.context = ctx;
  c->cq.channel = channel;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  return &c->cq;
}

FV_EXPORT int ibv_destroy_cq(struct ibv_cq* cq) {
  struct fv_cq* c = (struct fv_cq*)cq;
  free(c->ring);
  free(c);
  return 0;
}

int fv_cq_push(struct ibv_cq* cq, const struct ibv_wc* wc) {
  struct fv_cq* c = (struct fv_cq*)cq;
  if (c->count == c->cap) {
    fv_async_raise(cq->context, IBV_EVENT_CQ_ERR, NULL);
    return -1;
  }
  c->ring[(c->head + c->count++) % c->cap] = *wc;
  if (c->armed && cq->channel) {
    c->armed = 0;
    if (write(((struct fv_channel*)cq->channel)->wfd, &cq, sizeof(cq)) != sizeof(cq)) return -1;
  }
  return 0;
}

int fv_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc) {
  struct fv_cq* c = (struct fv_cq*)cq;
  int got = 0;
  pthread_mutex_lock(&fv_lock);
  while (got < n && c->count > 0) {
    wc[got++] = c->ring[c->head];
    c->head = (c->head + 1) % c->cap;
    c->count--;
  }
  pthread_mutex_unlock(&fv_lock);
  return got;
}

/* Armed: the next completion writes the channel. One already waiting
 * does not (as hardware: the caller polls once more after arming). */
int fv_req_notify_cq(struct ibv_cq* cq, int solicited_only) {
  (void)solicited_only;
  pthread_mutex_lock(&fv_lock);
  ((struct fv_cq*)cq)->armed = 1;
  pthread_mutex_unlock(&fv_lock);
  return 0;
}

FV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel* ch, struct ibv_cq** cq, void** cq_context) {
  struct ibv_cq* got = NULL;
  ssize_t n = read(ch->fd, &got, sizeof(got));
  if (n != sizeof(got)) return -1;
  *cq = got;
  *cq_context = got->cq_context;
  return 0;
}

FV_EXPORT void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  (void)cq, (void)nevents;
}

void fv_async_raise(struct ibv_context* ctx, enum ibv_event_type type, struct ibv_qp* qp) {
  struct ibv_async_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.event_type = type;
  if (qp) ev.element.qp = qp;
  if (write(((struct fv_context*)ctx)->async_wfd, &ev, sizeof(ev)) != sizeof(ev)) return;
}

FV_EXPORT int ibv_get_async_event(struct ibv_context* ctx, struct ibv_async_event* event) {
  return read(ctx->async_fd, event, sizeof(*event)) == sizeof(*event) ? 0 : -1;
}

FV_EXPORT void ibv_ack_async_event(struct ibv_async_event* event) {
  (void)event;
}

FV_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "RNR retry counter exceeded";
    default:
      return "unknown";
  }
}
