/*
 * A job's status (status_gather.c): every rank's flight recorder of one
 * comm, this rank's from memory and every other's over the comm's control
 * channel (a member's request, answered by that rank's status service),
 * taken twice a little apart so that a job that moves is told from one
 * that is stuck; then the verdict (status_verdict.c) and the answer to
 * braid-status. The control channel is the comm's own: authenticated by
 * its secret, nothing new opened to the network.
 */
#ifndef BRAID_STATUS_GATHER_H_
#define BRAID_STATUS_GATHER_H_

#include <stddef.h>
#include <stdint.h>

#include "flight.h"
#include "nccl.h"
#include "socket.h"

struct ncclComm;
struct strbuf;

/* What a gather needs of a comm, copied under the service's lock: the
 * comm itself is touched again only through status_snapshot_of. */
struct status_target {
  const struct ncclComm* comm; /* identity */
  struct ncclComm* held;       /* set when the caller holds the comm (braidCommStatus) */
  int rank, nranks;
  uint64_t secret; /* seals the requests; never leaves this process */
  struct socket_wire_addr mine;
  struct socket_wire_addr* ctrl; /* every rank's control address (malloc'd) */
  int32_t* pids;                 /* every rank's pid (malloc'd) */
  unsigned char* local;          /* every rank's: on this host (malloc'd) */
};

/* What a rank said, or why it said nothing. */
struct status_rank {
  int answered;
  char why[160]; /* no answer: refused (gone), reset, timed out (stopped?) */
  struct flight_wire w;
};

/* One rank's snapshot on its way (status_fetch.c). */
enum status_fetch_stage {
  FETCH_CONNECTING = 0,
  FETCH_LENGTH,
  FETCH_BODY,
  FETCH_SEAL,
  FETCH_DONE,
  FETCH_FAILED
};
struct status_fetch {
  int fd, rank;
  enum status_fetch_stage stage;
  uint64_t deadline_ns, nonce, seal;
  uint32_t len;
  size_t got;
};

/* Start fetching rank r's snapshot into out (a failure is said in out). */
void status_fetch_open(const struct status_target* t, int r, uint64_t deadline_ns,
                       struct status_fetch* f, struct status_rank* out);
/* poll() said revents for f->fd (stage FETCH_CONNECTING: POLLOUT, else POLLIN). */
void status_fetch_step(const struct status_target* t, struct status_fetch* f, short revents,
                       struct status_rank* out);
/* Its deadline passed: said as silence. */
void status_fetch_expire(struct status_fetch* f, struct status_rank* out);

/* What a snapshot takes on the wire (its used entries only), and the
 * seal a rank's reply carries: a keyed hash under the comm's secret and
 * the request's nonce, so that only a member's fresh answer is taken. */
size_t status_wire_bytes(const struct flight_wire* w);
uint64_t status_reply_seal(uint64_t secret, uint64_t nonce, const void* snapshot, size_t bytes);

/* Every rank's snapshot at two moments (`before`, then `now`). */
struct status_job {
  int nranks, rank; /* rank: the one that gathered */
  int gap_ms;       /* between the two */
  struct status_rank* before;
  struct status_rank* now;
};

ncclResult_t status_target_make(const struct ncclComm* comm, struct status_target* t);
void status_target_free(struct status_target* t);

/* The service's comms (status_service.c): copies of up to `max` targets. */
int status_targets(struct status_target* out, int max);
/* This rank's snapshot of comm, if the service still serves it. */
int status_snapshot_of(const struct ncclComm* comm, struct flight_wire* w);

/* Two rounds of snapshots, `gap_ms` apart, each within `round_ms`. */
ncclResult_t status_gather(const struct status_target* t, int gap_ms, int round_ms,
                           struct status_job* job);
void status_job_free(struct status_job* job);

/* The verdict a person acts on (status_verdict.c), first line the gist,
 * then what backs it, then the table of ranks. */
void status_verdict(const struct status_job* job, struct strbuf* out);

/* The job's status in the form asked (status_report.c; enum
 * status_what); `first`: the first comm of an answer (Prometheus' HELP). */
void status_report(const struct status_job* job, uint32_t what, int first, struct strbuf* out);
/* Gather t's job and report it (status_report) into out. */
ncclResult_t status_of(const struct status_target* t, uint32_t what, int first, struct strbuf* out);
/* Answer braid-status on fd, for every comm of this process. */
void status_answer(int fd, uint32_t what);

#endif /* BRAID_STATUS_GATHER_H_ */
