/*
 * The tuner's cost model of one communicator (tuner_types.h), built once
 * at init from the peer table (tuner_model.c), so every rank holds the
 * same.
 */
#ifndef BRAID_TUNER_MODEL_H_
#define BRAID_TUNER_MODEL_H_

#include <stddef.h>

#include "nccl.h"
#include "tuner_types.h"

struct ncclComm;

/* The model for a comm whose peer table and layout are known; reads
 * BRAID_TUNE_FILE (ncclInvalidArgument, with a WARN naming the line, if
 * it is malformed). */
ncclResult_t tuner_model_init(struct ncclComm* comm);

#endif /* BRAID_TUNER_MODEL_H_ */
