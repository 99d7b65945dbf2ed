/*
 * The emulated HCA: one thread per process that watches every QP's
 * sockets (epoll) and carries out what arrives, as a NIC does without the
 * host: requests from peers, their acknowledgements, new connections. And
 * the fault knobs (FAKEVERBS_FAULT, FAKEVERBS_DELAY_US).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fakeverbs.h"

static int g_epoll = -1;
static pthread_t g_thread;

int fv_write_all(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL); /* a peer gone is an error, not SIGPIPE */
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n, len -= (size_t)n;
  }
  return 0;
}

int fv_read_all(int fd, void* buf, size_t len) {
  char* p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n, len -= (size_t)n;
  }
  return 0;
}

/* epoll data: the QP number and which of its fds (QPs are looked up by
 * number under the lock, so a destroyed one is never touched). */
static uint64_t watch_tag(uint32_t qpn, enum fv_fd_kind what, int fd) {
  return (uint64_t)qpn << 40 | (uint64_t)what << 32 | (uint32_t)fd;
}

static void* hw_main(void* arg) {
  (void)arg;
  for (;;) {
    struct epoll_event ev[16];
    int n = epoll_wait(g_epoll, ev, 16, -1);
    for (int i = 0; i < n; i++) {
      uint64_t t = ev[i].data.u64;
      pthread_mutex_lock(&fv_lock);
      struct fv_qp* qp = fv_qp_lookup((uint32_t)(t >> 40));
      if (qp) fv_qp_event(qp, (int)(uint32_t)t, (enum fv_fd_kind)((t >> 32) & 0xff));
      pthread_mutex_unlock(&fv_lock);
    }
  }
  return NULL;
}

int fv_hw_watch(struct fv_qp* qp, int fd, enum fv_fd_kind what) {
  extern uint32_t fv_qp_num(const struct fv_qp* qp);
  if (g_epoll < 0) {
    g_epoll = epoll_create1(EPOLL_CLOEXEC);
    if (g_epoll < 0 || pthread_create(&g_thread, NULL, hw_main, NULL) != 0) return -1;
    pthread_detach(g_thread);
  }
  struct epoll_event ev = {.events = EPOLLIN, .data = {.u64 = watch_tag(fv_qp_num(qp), what, fd)}};
  return epoll_ctl(g_epoll, EPOLL_CTL_ADD, fd, &ev);
}

void fv_hw_unwatch(int fd) {
  epoll_ctl(g_epoll, EPOLL_CTL_DEL, fd, NULL);
}

/* The CPU time the HCA thread used so far (0: none started): the
 * emulation's own work, which the benchmark report takes out of a
 * process's CPU time to leave Braid's. */
uint64_t fv_hw_cpu_ns(void) {
  clockid_t cid;
  struct timespec ts;
  if (g_epoll < 0 || pthread_getcpuclockid(g_thread, &cid) != 0 || clock_gettime(cid, &ts) != 0)
    return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- Faults ---- */

static const char* const k_fault_names[FV_FAULT_COUNT] = {"access", "retry", "fatal", "rnr"};
static int g_fault_at[FV_FAULT_COUNT];
static int g_fault_seen[FV_FAULT_COUNT];
static char g_fault_spec[256]; /* the FAKEVERBS_FAULT the counts are for */

/* (Re)read the knob when it changed: a test may set it between cases,
 * and the counts then start over. */
static void faults_read(void) {
  const char* spec = getenv("FAKEVERBS_FAULT");
  char buf[256];
  if (spec == NULL) spec = "";
  if (strcmp(spec, g_fault_spec) == 0) return;
  snprintf(g_fault_spec, sizeof(g_fault_spec), "%s", spec);
  memset(g_fault_at, 0, sizeof(g_fault_at));
  memset(g_fault_seen, 0, sizeof(g_fault_seen));
  snprintf(buf, sizeof(buf), "%s", spec);
  for (char *save = NULL, *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
    char* colon = strchr(e, ':');
    int at = colon ? atoi(colon + 1) : 1;
    if (colon) *colon = '\0';
    for (int k = 0; k < FV_FAULT_COUNT; k++)
      if (strcmp(e, k_fault_names[k]) == 0) g_fault_at[k] = at > 0 ? at : 1;
  }
}

int fv_fault_now(enum fv_fault kind) {
  faults_read();
  return g_fault_at[kind] > 0 && ++g_fault_seen[kind] == g_fault_at[kind];
}

void fv_delay(void) {
  const char* d = getenv("FAKEVERBS_DELAY_US");
  if (d && atoi(d) > 0) usleep((useconds_t)atoi(d));
}
