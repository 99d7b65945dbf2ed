/*
 * BRAID_OP_LOG (flight_oplog.h): a JSON line per call, in a file of this
 * process (%h host, %p pid in its name) opened at the first call, this
 * user's alone (it tells what the job moves).
 */
#include "status/flight_oplog.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "status/flight_names.h"
#include "host_path.h"
#include "param.h"
#include "schedule.h"

/* nccl-tests' bus bandwidth factor of a collective on n ranks. */
static double bus_factor(int kind, int coll, int n) {
  if (kind != FLIGHT_COLL || n < 2) return 1.0;
  if (coll == COLL_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER) return (double)(n - 1) / n;
  return 1.0;
}

/* The transports an entry's links use, as JSON strings: "shm","tcp". */
static void transports_used(const struct flight_entry* e, char* out, size_t cap) {
  unsigned seen = 0;
  size_t o = 0;
  out[0] = '\0';
  for (uint32_t i = 0; i < atomic_load_explicit(&e->nlinks, memory_order_relaxed); i++) {
    unsigned t = e->links[i].transport;
    if (t >= 32 || (seen & (1u << t))) continue;
    seen |= 1u << t;
    o += (size_t)snprintf(out + o, cap - MIN(o, cap), "%s\"%s\"", o ? "," : "",
                          flight_transport_name((int)t));
    if (o >= cap) break;
  }
}

static void oplog_open(struct flight* f) {
  char path[512];
  f->oplog_tried = 1;
  host_expand_path(param_op_log(), path, sizeof(path));
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  f->oplog = fd >= 0 ? fdopen(fd, "a") : NULL;
  if (f->oplog == NULL) {
    if (fd >= 0) close(fd);
    WARN("BRAID_OP_LOG %s: %s; no per-call records", path, strerror(errno));
  }
}

void flight_oplog_write(struct flight* f, const struct flight_entry* e, uint64_t ns,
                        ncclResult_t status) {
  pthread_mutex_lock(&f->lock);
  if (!f->oplog_tried) oplog_open(f);
  if (f->oplog) {
    double s = (double)ns / 1e9, algbw = s > 0 ? (double)e->bytes / s / 1e9 : 0;
    char transports[64];
    transports_used(e, transports, sizeof(transports));
    fprintf(f->oplog,
            "{\"rank\":%d,\"nranks\":%d,\"seq\":%" PRIu64
            ",\"op\":\"%s\",\"type\":\"%s\","
            "\"bytes\":%" PRIu64
            ",\"time_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
            "\"algo\":\"%s\",\"transports\":[%s],\"status\":\"%s\"}\n",
            f->rank, f->nranks, atomic_load(&e->seq), flight_op_name(e->kind, e->coll),
            flight_type_name(e->type), e->bytes, s * 1e6, algbw,
            algbw * bus_factor(e->kind, e->coll, f->nranks), flight_algo_name(e->algo), transports,
            ncclGetErrorString(status));
    fflush(f->oplog);
  }
  pthread_mutex_unlock(&f->lock);
}

void flight_oplog_close(struct flight* f) {
  if (f->oplog) fclose(f->oplog);
  f->oplog = NULL;
}
