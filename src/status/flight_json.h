/*
 * A flight snapshot as JSON lines (flight_json.c), and the file a rank
 * writes to BRAID_TRACE_DIR when its comm fails or is aborted.
 */
#ifndef BRAID_FLIGHT_JSON_H_
#define BRAID_FLIGHT_JSON_H_

#include "status/flight.h"

struct strbuf;

/* One line for the rank, one per entry; `why`, when not NULL, goes into
 * the rank's line. */
void flight_json(const struct flight_wire* w, const char* why, struct strbuf* out);

/* This rank's snapshot to BRAID_TRACE_DIR (nothing when unset), once per
 * comm: a timeout, a remote error, an abort. */
void flight_dump(struct flight* f, const char* why);

#endif /* BRAID_FLIGHT_JSON_H_ */
