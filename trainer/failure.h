/* How braid-train stops on an error: one line on stderr naming the rank, what failed, where
 * in the run, and why; then exit status 1. Peers of a dead rank get Braid's error within its
 * timeout and say so, which is how a killed rank stops the others instead of hanging them. */
#ifndef TRAIN_FAILURE_H_
#define TRAIN_FAILURE_H_

#include <stddef.h>

#include "nccl.h"

#define TRAIN_ERR_MAX 8192 /* room for a message naming a path or two */

void train_die(const void* trainer, const char* fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Formats a message into err (errlen bytes) for a caller that reports it; returns -1. */
int train_errorf(char* err, size_t errlen, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Dies unless res is ncclSuccess. */
void train_check_nccl(const void* trainer, ncclResult_t res, const char* what);

#endif /* TRAIN_FAILURE_H_ */
