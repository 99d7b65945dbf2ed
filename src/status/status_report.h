/*
 * A job's status in the forms braid-status prints (status_report.c): the
 * verdict's text, JSON lines, Prometheus' text format.
 */
#ifndef BRAID_STATUS_REPORT_H_
#define BRAID_STATUS_REPORT_H_

#include <stdint.h>

#include "nccl.h"
#include "status/status_gather.h"

struct strbuf;

/* `what`: enum status_what (status_proto.h); `first`: the first comm of an
 * answer (Prometheus' HELP and TYPE lines). */
void status_report(const struct status_job* job, uint32_t what, int first, struct strbuf* out);
/* Gather t's job and report it into out. */
ncclResult_t status_of(const struct status_target* t, uint32_t what, int first, struct strbuf* out);

#endif /* BRAID_STATUS_REPORT_H_ */
