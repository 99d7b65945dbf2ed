/* What each rank hands to Braid, counted by collective and element type: the bytes a rank
 * contributes to each call (an all-reduce's or reduce's buffer, a broadcast root's buffer, an
 * all-gather's or gather's own part, a send). Training traffic (the scheme's gradients and
 * models) is kept apart from bookkeeping (statistics, checks, checkpoint sharing), which
 * every scheme pays alike. */
#ifndef TRAIN_WIRE_H_
#define TRAIN_WIRE_H_

#include <stddef.h>
#include <stdio.h>

#include "nccl.h"

typedef enum {
  WIRE_ALLREDUCE,
  WIRE_REDUCE,
  WIRE_BROADCAST,
  WIRE_ALLGATHER,
  WIRE_GATHER,
  WIRE_SEND,
  WIRE_NCOLLS
} wire_coll_t;

#define WIRE_NTYPES 12 /* ncclDataType_t values counted */

typedef struct {
  double bytes[WIRE_NCOLLS][WIRE_NTYPES]; /* training traffic */
  double other;                           /* bookkeeping */
} wire_t;

/* count elements of type handed to one call of coll. */
void wire_add(wire_t* w, wire_coll_t coll, ncclDataType_t type, size_t count);
/* Bookkeeping bytes. */
void wire_add_other(wire_t* w, ncclDataType_t type, size_t count);

/* Training bytes in all. */
double wire_total(const wire_t* w);

/* "allreduce f16 12.3 MB, allgather i32 1.2 MB" into out (the non-zero ones). */
void wire_describe(const wire_t* w, double scale, char* out, size_t outlen);

size_t wire_type_bytes(ncclDataType_t type);

#endif /* TRAIN_WIRE_H_ */
