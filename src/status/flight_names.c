/*
 * The names a flight snapshot's numbers are shown by (flight.h), and back:
 * the dumps braid-status reads hold the names, not the numbers, so that a
 * person reads them as they are.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "status/flight_names.h"
#include "schedule.h"
#include "transport_table.h"
#include "sched_algos.h"

static const char* const type_names[] = {"int8",   "uint8",    "int32",   "uint32",
                                         "int64",  "uint64",   "half",    "float",
                                         "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
static const char* const redop_names[] = {"sum", "prod", "max", "min", "avg"};
static const char* const state_names[] = {"?", "queued", "running", "done", "failed"};
/* as nccl-tests and PyTorch name them, by enum sched_coll */
static const char* const coll_names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                         "reduce"};
_Static_assert(sizeof(coll_names) / sizeof(coll_names[0]) == COLL_COUNT, "a name per collective");

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char* name_of(const char* const* names, int n, int i, const char* none) {
  return i >= 0 && i < n ? names[i] : none;
}

static int index_of(const char* const* names, int n, const char* name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

const char* flight_op_name(int kind, int coll) {
  if (kind != FLIGHT_COLL) return kind == FLIGHT_SEND ? "send" : "recv";
  return name_of(coll_names, COUNT(coll_names), coll, "?");
}

const char* flight_type_name(int type) {
  return name_of(type_names, COUNT(type_names), type, "?");
}

const char* flight_redop_name(int op) {
  return op >= COUNT(redop_names) ? "custom" : name_of(redop_names, COUNT(redop_names), op, "-");
}

/* Transports by their descriptors' keys: one this build lacks reads "?". */
const char* flight_transport_name(int id) {
  const char* key = id >= 0 ? transport_key_of((unsigned)id) : NULL;
  return key ? key : "?";
}

const char* flight_state_name(int state) {
  return name_of(state_names, COUNT(state_names), state, "?");
}

const char* flight_algo_name(int algo) {
  return algo == FLIGHT_ALGO_DIRECT ? "direct" : algo >= 0 ? sched_algo_name(algo) : "-";
}

int flight_op_parse(const char* name, int* kind, int* coll) {
  *coll = -1;
  if (strcmp(name, "send") == 0 || strcmp(name, "recv") == 0) {
    *kind = name[0] == 's' ? FLIGHT_SEND : FLIGHT_RECV;
    return 0;
  }
  *kind = FLIGHT_COLL;
  *coll = index_of(coll_names, COUNT(coll_names), name);
  return *coll < 0 ? -1 : 0;
}

int flight_type_parse(const char* name) {
  return index_of(type_names, COUNT(type_names), name);
}

int flight_redop_parse(const char* name) {
  return index_of(redop_names, COUNT(redop_names), name);
}

int flight_transport_parse(const char* name) {
  int id = transport_id_of(name);
  return id < 0 ? 255 : id;
}

int flight_state_parse(const char* name) {
  return MAX(index_of(state_names, COUNT(state_names), name), 0);
}

int flight_algo_parse(const char* name) {
  if (strcmp(name, "direct") == 0) return FLIGHT_ALGO_DIRECT;
  for (int a = 0; a < sched_algo_count(); a++)
    if (strcmp(sched_algo_name(a), name) == 0) return a;
  return -1;
}

int flight_status_parse(const char* name) {
  for (int r = ncclSuccess; r < ncclNumResults; r++)
    if (strcmp(ncclGetErrorString((ncclResult_t)r), name) == 0) return r;
  return ncclInternalError;
}

void flight_wall_time(uint64_t wall_ms, char* out, size_t cap) {
  time_t t = (time_t)(wall_ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(wall_ms % 1000));
}
