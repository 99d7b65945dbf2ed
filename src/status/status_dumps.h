/*
 * Reading back what ranks left in BRAID_TRACE_DIR (status_dumps.c): every
 * file's JSON lines into the snapshots they were made from, grouped into a
 * job per comm, ready for the same verdict as a live status. A rank of a
 * comm with no file "is gone": it died without writing one, or it never
 * failed and still runs.
 */
#ifndef BRAID_STATUS_DUMPS_H_
#define BRAID_STATUS_DUMPS_H_

#include "nccl.h"
#include "status/status_gather.h"

struct status_dumps {
  int njobs;
  struct status_job* jobs; /* before and now are the same snapshots */
};

ncclResult_t status_dumps_read(const char* dir, struct status_dumps* out);
void status_dumps_free(struct status_dumps* d);

/* One JSON line of a dump into w: the rank's line (*is_rank set) or one
 * of its entries (appended). 0 when it was one of them. */
int status_dump_line(const char* line, struct flight_wire* w, int* is_rank);

#endif /* BRAID_STATUS_DUMPS_H_ */
