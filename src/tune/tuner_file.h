/*
 * Tune files (tuner_file.c, BRAID_TUNE_FILE): link costs and forced
 * choices read into a comm's cost model.
 */
#ifndef BRAID_TUNER_FILE_H_
#define BRAID_TUNER_FILE_H_

#include <stddef.h>
#include <stdio.h>

#include "nccl.h"
#include "tune/tuner_types.h"

/* Parse the file at `path` into the model. */
ncclResult_t tuner_file_read(const char* path, struct tuner_model* m);
/* The same on an open stream; `name` names it in WARNs. */
ncclResult_t tuner_file_parse(FILE* f, const char* name, struct tuner_model* m);
/* The forced choice for a call, if a line covers it and NCCL_ALGO (as the
 * `allowed` mask) allows it; *chunk 0 where the line leaves it to the
 * tuner. */
int tuner_file_choice(const struct tuner_model* m, int coll, size_t bytes, unsigned allowed,
                      int* algo, size_t* chunk);

#endif /* BRAID_TUNER_FILE_H_ */
