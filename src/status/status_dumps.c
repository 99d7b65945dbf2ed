/*
 * The dumps of BRAID_TRACE_DIR read back (status_dumps.h). Each file is
 * one rank's snapshot of one comm: its rank line, then its entries. Ages
 * in a file count from when it was written; merged, they count from the
 * newest file, so that ranks that wrote at different times compare.
 */
#include "status/status_dumps.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "status/flight.h"
#include "status/flight_names.h"
#include "status/status_json.h"

#define DUMP_MAX_BYTES (4u << 20) /* a dump is ~20 KiB: larger is not one */
#define DUMP_MAX_JOBS 64

/* ---- one line ---- */

static void rank_member(const char* key, const char* v, void* arg) {
  struct flight_wire* w = arg;
  char s[FLIGHT_ERROR_LEN];
  if (strcmp(key, "rank") == 0)
    w->rank = (int32_t)json_int(v);
  else if (strcmp(key, "nranks") == 0)
    w->nranks = (int32_t)json_int(v);
  else if (strcmp(key, "pid") == 0)
    w->pid = (int32_t)json_int(v);
  else if (strcmp(key, "host") == 0)
    json_string(v, w->host, sizeof(w->host));
  else if (strcmp(key, "comm") == 0 && json_string(v, s, sizeof(s)))
    w->comm_id = strtoull(s, NULL, 16);
  else if (strcmp(key, "at_ms") == 0)
    w->now_wall_ms = json_uint(v);
  else if (strcmp(key, "ops") == 0)
    w->next_seq = json_uint(v);
  else if (strcmp(key, "collectives") == 0)
    w->next_coll = json_uint(v);
  else if (strcmp(key, "done") == 0)
    w->ops_done = json_uint(v);
  else if (strcmp(key, "failed") == 0)
    w->ops_failed = json_uint(v);
  else if (strcmp(key, "bytes") == 0)
    w->bytes_done = json_uint(v);
  else if (strcmp(key, "error") == 0 && json_string(v, s, sizeof(s)))
    w->last_error_code = flight_status_parse(s);
  else if (strcmp(key, "error_at_ms") == 0)
    w->last_error_wall_ms = json_uint(v);
  else if (strcmp(key, "error_text") == 0)
    json_string(v, w->last_error, sizeof(w->last_error));
}

static void link_member(const char* key, const char* v, void* arg) {
  struct flight_wire_link* l = arg;
  char s[32];
  if (strcmp(key, "peer") == 0)
    l->peer = (int32_t)json_int(v);
  else if (strcmp(key, "dir") == 0 && json_string(v, s, sizeof(s)))
    l->dir = strcmp(s, "send") == 0;
  else if (strcmp(key, "transport") == 0 && json_string(v, s, sizeof(s)))
    l->transport = (uint8_t)flight_transport_parse(s);
  else if (strcmp(key, "posted") == 0)
    l->posted = json_uint(v);
  else if (strcmp(key, "done") == 0)
    l->done = json_uint(v);
  else if (strcmp(key, "idle_ms") == 0)
    l->idle_ms = json_int(v);
}

static int entry_link(const char* element, void* arg) {
  struct flight_wire_entry* e = arg;
  if (e->nlinks == FLIGHT_LINKS) return 0;
  struct flight_wire_link* l = &e->links[e->nlinks];
  memset(l, 0, sizeof(*l));
  if (json_members(element, link_member, l) != 0) return -1;
  e->nlinks++;
  return 0;
}

static void entry_member(const char* key, const char* v, void* arg) {
  struct flight_wire_entry* e = arg;
  char s[32];
  if (strcmp(key, "seq") == 0)
    e->seq = json_uint(v);
  else if (strcmp(key, "coll_seq") == 0)
    e->coll_seq = json_uint(v);
  else if (strcmp(key, "op") == 0 && json_string(v, s, sizeof(s))) {
    if (flight_op_parse(s, &e->kind, &e->coll) != 0) e->coll = -1;
  } else if (strcmp(key, "type") == 0 && json_string(v, s, sizeof(s)))
    e->type = flight_type_parse(s);
  else if (strcmp(key, "redop") == 0 && json_string(v, s, sizeof(s)))
    e->op = flight_redop_parse(s);
  else if (strcmp(key, "count") == 0)
    e->count = json_uint(v);
  else if (strcmp(key, "bytes") == 0)
    e->bytes = json_uint(v);
  else if (strcmp(key, "root") == 0)
    e->root = (int32_t)json_int(v);
  else if (strcmp(key, "peer") == 0)
    e->peer = (int32_t)json_int(v);
  else if (strcmp(key, "tag") == 0)
    e->tag = (int32_t)json_int(v);
  else if (strcmp(key, "algo") == 0 && json_string(v, s, sizeof(s)))
    e->algo = flight_algo_parse(s);
  else if (strcmp(key, "state") == 0 && json_string(v, s, sizeof(s)))
    e->state = flight_state_parse(s);
  else if (strcmp(key, "status") == 0 && json_string(v, s, sizeof(s)))
    e->status = flight_status_parse(s);
  else if (strcmp(key, "enqueued_ms_ago") == 0)
    e->enq_age_ms = json_int(v);
  else if (strcmp(key, "started_ms_ago") == 0)
    e->start_age_ms = json_int(v);
  else if (strcmp(key, "ended_ms_ago") == 0)
    e->end_age_ms = json_int(v);
  else if (strcmp(key, "links") == 0)
    json_elements(v, entry_link, e);
}

int status_dump_line(const char* line, struct flight_wire* w, int* is_rank) {
  *is_rank = strstr(line, "\"nranks\":") != NULL && strstr(line, "\"seq\":") == NULL;
  if (*is_rank) return json_members(line, rank_member, w);
  if (w->nentries == FLIGHT_WIRE_ENTRIES) return 0; /* more than a snapshot holds: dropped */
  struct flight_wire_entry* e = &w->entries[w->nentries];
  memset(e, 0, sizeof(*e));
  if (json_members(line, entry_member, e) != 0 || e->seq == 0) return -1;
  w->nentries++;
  return 0;
}

/* ---- one file ---- */

/* The whole file, NUL-terminated (this user's regular file, not a link). */
static char* file_text(const char* path) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  char* text = NULL;
  if (fd < 0) return NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < DUMP_MAX_BYTES &&
      (text = malloc((size_t)st.st_size + 1)) != NULL) {
    ssize_t n = read(fd, text, (size_t)st.st_size);
    if (n < 0) n = 0;
    text[n] = '\0';
  }
  close(fd);
  return text;
}

/* The file's snapshot into w; 0 when it is a whole dump. */
static int dump_read(const char* path, struct flight_wire* w) {
  char* text = file_text(path);
  int ranks = 0, bad = 0;
  if (text == NULL) return -1;
  memset(w, 0, sizeof(*w));
  w->magic = FLIGHT_WIRE_MAGIC;
  w->version = FLIGHT_WIRE_VERSION;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    int is_rank;
    bad |= status_dump_line(line, w, &is_rank) != 0;
    ranks += is_rank;
  }
  free(text);
  if (bad || ranks != 1 || w->nranks < 1 || w->rank < 0 || w->rank >= w->nranks) {
    WARN("braid-status: %s is not a whole Braid dump; skipped", path);
    return -1;
  }
  return 0;
}

/* ---- the jobs ---- */

static struct status_job* job_of(struct status_dumps* d, const struct flight_wire* w) {
  for (int i = 0; i < d->njobs; i++) {
    struct status_job* j = &d->jobs[i];
    if (j->rank >= 0 && j->now[j->rank].w.comm_id == w->comm_id && j->nranks == w->nranks) return j;
  }
  if (d->njobs == DUMP_MAX_JOBS ||
      braid_realloc(&d->jobs, (size_t)d->njobs + 1, sizeof(*d->jobs)) != ncclSuccess)
    return NULL;
  struct status_job* j = &d->jobs[d->njobs];
  memset(j, 0, sizeof(*j));
  j->nranks = w->nranks;
  j->rank = -1;
  if (braid_calloc(&j->now, (size_t)w->nranks, sizeof(*j->now)) != ncclSuccess) return NULL;
  d->njobs++;
  return j;
}

static void age_shift(int64_t* age, int64_t by) {
  if (*age >= 0) *age += by;
}

/* Ages from the newest file's moment; the ranks without a file named. */
static void job_finish(struct status_job* j) {
  uint64_t newest = 0;
  for (int r = 0; r < j->nranks; r++)
    if (j->now[r].answered) newest = MAX(newest, j->now[r].w.now_wall_ms);
  for (int r = 0; r < j->nranks; r++) {
    struct status_rank* s = &j->now[r];
    if (!s->answered) {
      snprintf(s->why, sizeof(s->why), "gone: it left no dump (killed, or it never failed)");
      continue;
    }
    int64_t by = (int64_t)(newest - MIN(newest, s->w.now_wall_ms));
    for (uint32_t i = 0; i < s->w.nentries; i++) {
      struct flight_wire_entry* e = &s->w.entries[i];
      age_shift(&e->enq_age_ms, by);
      age_shift(&e->start_age_ms, by);
      age_shift(&e->end_age_ms, by);
      for (uint32_t k = 0; k < e->nlinks; k++) age_shift(&e->links[k].idle_ms, by);
    }
    s->w.now_wall_ms = newest;
  }
  j->before = j->now; /* one look: nothing is seen to move */
}

ncclResult_t status_dumps_read(const char* dir, struct status_dumps* out) {
  ncclResult_t res = ncclSuccess;
  struct flight_wire* w = NULL;
  struct dirent* de;
  char path[4096];
  memset(out, 0, sizeof(*out));
  DIR* d = opendir(dir);
  if (d == NULL)
    FAIL(ncclInvalidArgument, "braid-status: cannot read %s: %s", dir, strerror(errno));
  CHECK(braid_calloc(&w, 1, sizeof(*w)));
  while ((de = readdir(d)) != NULL) {
    size_t n = strlen(de->d_name);
    if (strncmp(de->d_name, "braid-", 6) != 0 || n < 6 || strcmp(de->d_name + n - 6, ".jsonl") != 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    if (dump_read(path, w) != 0) continue;
    struct status_job* j = job_of(out, w);
    if (j == NULL) FAIL(ncclSystemError, "braid-status: out of memory for the dumps");
    if (j->now[w->rank].answered) continue; /* the same rank twice: its first kept */
    j->now[w->rank].answered = 1;
    j->now[w->rank].w = *w;
    if (j->rank < 0) j->rank = w->rank;
  }
  if (out->njobs == 0)
    FAIL(ncclInvalidArgument, "braid-status: no Braid dump (braid-*.jsonl) in %s", dir);
  for (int i = 0; i < out->njobs; i++) job_finish(&out->jobs[i]);
fail:
  if (d) closedir(d);
  free(w);
  if (res != ncclSuccess) status_dumps_free(out);
  return res;
}

void status_dumps_free(struct status_dumps* d) {
  for (int i = 0; i < d->njobs; i++) free(d->jobs[i].now);
  free(d->jobs);
  memset(d, 0, sizeof(*d));
}
