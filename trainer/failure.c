/* Error exits. Takes the trainer as const void* so the layers below it need not know it. */
#include "failure.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "train.h"

int train_errorf(char* err, size_t errlen, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

void train_die(const void* trainer, const char* fmt, ...) {
  const trainer_t* t = trainer;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fflush(stdout);
  fprintf(stderr, "braid-train: rank %d: %s\n", t->rank, msg);
  exit(EXIT_FAILURE);
}

void train_check_nccl(const void* trainer, ncclResult_t res, const char* what) {
  if (res == ncclSuccess) return;
  const trainer_t* t = trainer;
  const char* hint = "";
  if (res == ncclRemoteError || res == ncclSystemError)
    hint = "; another rank has probably died or become unreachable, stopping";
  const char* last = ncclGetLastError(t->comm);
  const int has_last = last && *last;
  train_die(t, "%s failed at epoch %d, step %d: %s%s%s%s%s", what, t->epoch + 1, t->step,
            ncclGetErrorString(res), has_last ? " (" : "", has_last ? last : "",
            has_last ? ")" : "", hint);
}
