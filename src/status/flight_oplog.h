/*
 * BRAID_OP_LOG (flight_oplog.c): one JSON line per call, in the spirit of
 * NCCL's Inspector: bytes, time, algbw and busbw, algorithm, transports.
 */
#ifndef BRAID_FLIGHT_OPLOG_H_
#define BRAID_FLIGHT_OPLOG_H_

#include <stdint.h>

#include "status/flight.h"

/* Entry e ended with `status` after `ns` of running. */
void flight_oplog_write(struct flight* f, const struct flight_entry* e, uint64_t ns,
                        ncclResult_t status);
void flight_oplog_close(struct flight* f);

#endif /* BRAID_FLIGHT_OPLOG_H_ */
