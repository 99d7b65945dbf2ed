/*
 * Gathering a job's status (status_gather.h): a member's status request to
 * every other rank at once over the comm's control channel, their answers
 * read side by side against one deadline (a stopped rank costs the round,
 * not a round per rank), two rounds.
 */
#include "status/status_gather.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/comm_ctrl.h"
#include "core.h"
#include "status/status_fetch.h"

#define STATUS_FANOUT 256 /* fetches of a round at once */

ncclResult_t status_target_make(const struct ncclComm* comm, struct status_target* t) {
  memset(t, 0, sizeof(*t));
  t->comm = comm;
  t->rank = comm->rank;
  t->nranks = comm->nranks;
  t->secret = comm->tctx.secret;
  t->mine = comm->ctrl_addr;
  t->ctrl = malloc((size_t)comm->nranks * sizeof(*t->ctrl));
  t->pids = malloc((size_t)comm->nranks * sizeof(*t->pids));
  t->local = malloc((size_t)comm->nranks);
  if (t->ctrl == NULL || t->pids == NULL || t->local == NULL) {
    status_target_free(t);
    return ncclSystemError;
  }
  for (int r = 0; r < comm->nranks; r++) {
    t->ctrl[r] = comm->peers[r].ctrl;
    t->pids[r] = comm->peers[r].pid;
    t->local[r] = comm->peers[r].host_hash == comm->peers[comm->rank].host_hash;
  }
  return ncclSuccess;
}

void status_target_free(struct status_target* t) {
  free(t->ctrl);
  free(t->pids);
  free(t->local);
  t->ctrl = NULL;
  t->pids = NULL;
  t->local = NULL;
}

/* What this host says of a local rank that did not answer: its process
 * stopped (SIGSTOP, a debugger) or gone. */
static void local_state(const struct status_target* t, int r, struct status_rank* out) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)t->pids[r]);
  FILE* f = fopen(path, "re");
  size_t n = strlen(out->why);
  if (f == NULL) {
    snprintf(out->why + n, sizeof(out->why) - n, "; its process %d is gone", (int)t->pids[r]);
    return;
  }
  const char* paren = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
  fclose(f);
  char state = paren && paren[1] == ' ' ? paren[2] : '?';
  if (state == 'T' || state == 't')
    snprintf(out->why + n, sizeof(out->why) - n, "; its process %d is stopped (%s)",
             (int)t->pids[r], state == 'T' ? "SIGSTOP?" : "a debugger");
  else if (state == 'Z')
    snprintf(out->why + n, sizeof(out->why) - n, "; its process %d has exited", (int)t->pids[r]);
}

/* One round: every rank's snapshot into out[nranks], at most
 * STATUS_FANOUT fetches at once (a job of 16k ranks must not take 16k
 * fds), each within round_ms of its start. */
static void status_round(const struct status_target* t, int round_ms, struct status_rank* out) {
  struct status_fetch f[STATUS_FANOUT];
  struct pollfd p[STATUS_FANOUT];
  int nf = 0, next = 0;
  for (;;) {
    while (nf < STATUS_FANOUT && next < t->nranks) { /* start more */
      int r = next++;
      if (r == t->rank) {
        memset(&out[r], 0, sizeof(out[r]));
        out[r].answered = t->self_snapshot(t, &out[r].w);
        if (!out[r].answered) snprintf(out[r].why, sizeof(out[r].why), "was destroyed meanwhile");
        continue;
      }
      status_fetch_open(t, r, socket_deadline(round_ms), &f[nf], &out[r]);
      if (f[nf].stage < FETCH_DONE) nf++;
    }
    if (nf == 0) break;
    uint64_t now = braid_now_ns(), first = UINT64_MAX;
    for (int i = 0; i < nf; i++) {
      p[i] = (struct pollfd){f[i].fd, f[i].stage == FETCH_CONNECTING ? POLLOUT : POLLIN, 0};
      first = MIN(first, f[i].deadline_ns);
    }
    int wait_ms = first > now ? (int)((first - now) / 1000000u) + 1 : 0;
    if (poll(p, (nfds_t)nf, wait_ms) < 0 && errno != EINTR) wait_ms = 0;
    now = braid_now_ns();
    for (int i = 0; i < nf; i++) {
      status_fetch_step(t, &f[i], p[i].revents, &out[f[i].rank]);
      if (f[i].stage < FETCH_DONE && now >= f[i].deadline_ns)
        status_fetch_expire(&f[i], &out[f[i].rank]);
    }
    int kept = 0; /* the finished ones leave */
    for (int i = 0; i < nf; i++)
      if (f[i].stage < FETCH_DONE) f[kept++] = f[i];
    nf = kept;
  }
  for (int r = 0; r < t->nranks; r++)
    if (!out[r].answered && t->local[r] && r != t->rank) local_state(t, r, &out[r]);
}

ncclResult_t status_gather(const struct status_target* t, int gap_ms, int round_ms,
                           struct status_job* job) {
  memset(job, 0, sizeof(*job));
  job->nranks = t->nranks;
  job->rank = t->rank;
  job->gap_ms = gap_ms;
  job->before = calloc((size_t)t->nranks, sizeof(*job->before));
  job->now = calloc((size_t)t->nranks, sizeof(*job->now));
  if (job->before == NULL || job->now == NULL) {
    status_job_free(job);
    return ncclSystemError;
  }
  status_round(t, round_ms, job->before);
  usleep((useconds_t)gap_ms * 1000u);
  status_round(t, round_ms, job->now);
  return ncclSuccess;
}

void status_job_free(struct status_job* job) {
  free(job->before);
  free(job->now);
  job->before = job->now = NULL;
}
