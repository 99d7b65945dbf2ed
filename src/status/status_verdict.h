/*
 * The verdict on a job's status (status_verdict.c): from every rank's two
 * snapshots, the line a person acts on, what backs it, then a table of the
 * ranks. Pure: snapshots in, text out (live gathers and dumps alike).
 */
#ifndef BRAID_STATUS_VERDICT_H_
#define BRAID_STATUS_VERDICT_H_

#include "status/status_gather.h"

struct strbuf;

void status_verdict(const struct status_job* job, struct strbuf* out);

#endif /* BRAID_STATUS_VERDICT_H_ */
