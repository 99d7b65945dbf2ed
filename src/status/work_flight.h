/*
 * A unit's ops in the flight recorder (work_flight.c): what each call is
 * and which connections it uses, as the recorder (flight.h) keeps them.
 */
#ifndef BRAID_WORK_FLIGHT_H_
#define BRAID_WORK_FLIGHT_H_

#include "nccl.h"

struct work_op;

/* The op is issued (under its comm's turn lock): numbered and recorded. */
void work_flight_enqueue(struct work_op* op);
/* It starts: its algorithm and the connections it will use. */
void work_flight_start(struct work_op* op);
/* It moved (now_idle: its unit is about to wait). */
void work_flight_progress(struct work_op* op, int now_idle);
void work_flight_end(struct work_op* op, ncclResult_t status);

#endif /* BRAID_WORK_FLIGHT_H_ */
