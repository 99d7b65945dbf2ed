/*
 * A flight snapshot as JSON lines (flight.h), and the file a failing rank
 * leaves in BRAID_TRACE_DIR: what braid-status --dumps merges after the
 * fact (status_dumps.c reads it back). Nothing in it opens the job: no
 * secret, no address beyond the host name.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "status/flight_json.h"
#include "status/flight_names.h"
#include "param.h"
#include "strbuf.h"

static void json_link(struct strbuf* b, const struct flight_wire_link* l, int first) {
  strbuf_printf(b,
                "%s{\"peer\":%d,\"dir\":\"%s\",\"transport\":\"%s\",\"posted\":%" PRIu64
                ",\"done\":%" PRIu64 ",\"idle_ms\":%" PRId64 "}",
                first ? "" : ",", l->peer, l->dir ? "send" : "recv",
                flight_transport_name(l->transport), l->posted, l->done, l->idle_ms);
}

static void json_entry(struct strbuf* b, const struct flight_wire* w,
                       const struct flight_wire_entry* e) {
  strbuf_printf(
      b,
      "{\"rank\":%d,\"seq\":%" PRIu64 ",\"coll_seq\":%" PRIu64
      ",\"op\":\"%s\",\"type\":\"%s\",\"redop\":\"%s\",\"count\":%" PRIu64 ",\"bytes\":%" PRIu64
      ",\"root\":%d,\"peer\":%d,\"tag\":%d,\"algo\":\"%s\",\"state\":\"%s\","
      "\"status\":\"%s\",\"enqueued_ms_ago\":%" PRId64 ",\"started_ms_ago\":%" PRId64
      ",\"ended_ms_ago\":%" PRId64 ",\"links\":[",
      w->rank, e->seq, e->coll_seq, flight_op_name(e->kind, e->coll), flight_type_name(e->type),
      flight_redop_name(e->op), e->count, e->bytes, e->root, e->peer, e->tag,
      flight_algo_name(e->algo), flight_state_name(e->state),
      ncclGetErrorString((ncclResult_t)e->status), e->enq_age_ms, e->start_age_ms, e->end_age_ms);
  for (uint32_t i = 0; i < e->nlinks; i++) json_link(b, &e->links[i], i == 0);
  strbuf_printf(b, "]}\n");
}

void flight_json(const struct flight_wire* w, const char* why, struct strbuf* b) {
  char at[40] = "";
  flight_wall_time(w->now_wall_ms, at, sizeof(at));
  strbuf_printf(b, "{\"rank\":%d,\"nranks\":%d,\"pid\":%d,\"host\":", w->rank, w->nranks, w->pid);
  strbuf_json_string(b, w->host);
  strbuf_printf(b,
                ",\"comm\":\"%016" PRIx64 "\",\"at\":\"%s\",\"at_ms\":%" PRIu64 ",\"ops\":%" PRIu64
                ",\"collectives\":%" PRIu64 ",\"done\":%" PRIu64 ",\"failed\":%" PRIu64
                ",\"bytes\":%" PRIu64,
                w->comm_id, at, w->now_wall_ms, w->next_seq, w->next_coll, w->ops_done,
                w->ops_failed, w->bytes_done);
  if (w->last_error_code != ncclSuccess) {
    char err_at[40];
    flight_wall_time(w->last_error_wall_ms, err_at, sizeof(err_at));
    strbuf_printf(
        b, ",\"error\":\"%s\",\"error_at\":\"%s\",\"error_at_ms\":%" PRIu64 ",\"error_text\":",
        ncclGetErrorString((ncclResult_t)w->last_error_code), err_at, w->last_error_wall_ms);
    strbuf_json_string(b, w->last_error);
  }
  if (why) {
    strbuf_printf(b, ",\"why\":");
    strbuf_json_string(b, why);
  }
  strbuf_printf(b, "}\n");
  for (uint32_t i = 0; i < w->nentries; i++) json_entry(b, w, &w->entries[i]);
}

/* This user's file alone, never through a link someone planted. */
static void dump_write(const char* path, const struct strbuf* text, int rank, const char* why) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || text->failed || write(fd, text->s, text->len) != (ssize_t)text->len)
    WARN("BRAID_TRACE_DIR: cannot write %s: %s", path,
         text->failed ? "out of memory" : strerror(errno));
  else
    INFO(SUB_INIT, "Rank %d: flight recorder written to %s (%s)", rank, path, why);
  if (fd >= 0) close(fd);
}

void flight_dump(struct flight* f, const char* why) {
  const char* dir = param_trace_dir();
  struct strbuf text = {0};
  char path[512];
  int expected = 0;
  if (dir == NULL || !f->inited || !atomic_compare_exchange_strong(&f->dumped, &expected, 1))
    return;
  struct flight_wire* w = malloc(sizeof(*w)); /* large: not on a waiting thread's stack */
  if (w == NULL) {
    WARN("BRAID_TRACE_DIR: out of memory for rank %d's recorder", f->rank);
    return;
  }
  flight_snapshot(f, w);
  flight_json(w, why, &text);
  snprintf(path, sizeof(path), "%s/braid-%s-%d-%016" PRIx64 "-rank%d.jsonl", dir, w->host,
           (int)w->pid, w->comm_id, f->rank);
  dump_write(path, &text, f->rank, why);
  strbuf_free(&text);
  free(w);
}
