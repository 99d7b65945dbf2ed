/*
 * A job's status (status_gather.c): every rank's flight recorder of one
 * comm, this rank's from memory and every other's over the comm's control
 * channel (a member's request, answered by that rank's status service),
 * taken twice a little apart so that a job that moves is told from one
 * that is stuck (status_verdict.h tells the verdict, status_report.h the
 * forms). The control channel is the comm's own: authenticated by its
 * secret, nothing new opened to the network.
 */
#ifndef BRAID_STATUS_GATHER_H_
#define BRAID_STATUS_GATHER_H_

#include <stddef.h>
#include <stdint.h>

#include "status/flight.h"
#include "nccl.h"
#include "socket.h"

struct ncclComm;

/* What a gather needs of a comm, copied while it is held: the comm itself
 * is touched again only through self_snapshot. */
struct status_target {
  const struct ncclComm* comm; /* identity */
  /* this rank's own snapshot: 1, or 0 when the comm is gone meanwhile */
  int (*self_snapshot)(const struct status_target* t, struct flight_wire* w);
  struct ncclComm* held; /* for self_snapshot: the comm when its caller holds it */
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

/* Every rank's snapshot at two moments (`before`, then `now`). */
struct status_job {
  int nranks, rank; /* rank: the one that gathered */
  int gap_ms;       /* between the two */
  struct status_rank* before;
  struct status_rank* now;
};

ncclResult_t status_target_make(const struct ncclComm* comm, struct status_target* t);
void status_target_free(struct status_target* t);

/* Two rounds of snapshots, `gap_ms` apart, each within `round_ms`. */
ncclResult_t status_gather(const struct status_target* t, int gap_ms, int round_ms,
                           struct status_job* job);
void status_job_free(struct status_job* job);

#endif /* BRAID_STATUS_GATHER_H_ */
