/*
 * A job's status in the forms braid-status prints (status_gather.h): the
 * verdict, JSON lines (every rank's recorder, then the verdict), and
 * Prometheus' text format (a node exporter's text-file collector reads
 * it).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "status/flight_json.h"
#include "status/status_proto.h"
#include "status/status_report.h"
#include "status/status_verdict.h"
#include "strbuf.h"

#define STATUS_GAP_MS 300   /* between the two rounds of a gather */
#define STATUS_ROUND_MS 600 /* a rank silent that long in a round does not answer */

/* The verdict's lines as one JSON line: {"comm":..,"verdict":[..]}. */
static void json_verdict(struct strbuf* out, uint64_t comm_id, const char* verdict) {
  char line[1024];
  strbuf_printf(out, "{\"comm\":\"%016" PRIx64 "\",\"verdict\":[", comm_id);
  for (const char* l = verdict; *l;) {
    const char* e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    snprintf(line, sizeof(line), "%.*s", (int)len, l);
    if (l != verdict) strbuf_printf(out, ",");
    strbuf_json_string(out, line);
    l += len + (e != NULL);
  }
  strbuf_printf(out, "]}\n");
}

static void report_json(const struct status_job* job, const char* verdict, struct strbuf* out) {
  uint64_t id = 0;
  for (int r = 0; r < job->nranks; r++) {
    const struct status_rank* s = &job->now[r];
    if (s->answered) {
      flight_json(&s->w, NULL, out);
      id = id ? id : s->w.comm_id;
      continue;
    }
    strbuf_printf(out, "{\"rank\":%d,\"nranks\":%d,\"answered\":false,\"why\":", r, job->nranks);
    strbuf_json_string(out, s->why);
    strbuf_printf(out, "}\n");
  }
  json_verdict(out, id, verdict);
}

/* Prometheus' text format: HELP and TYPE once per metric (first), a sample
 * per rank labelled with its comm, rank and host. */
static void report_prometheus(const struct status_job* job, int first, struct strbuf* out) {
  static const char* const metrics[][3] = {
      {"braid_rank_up", "gauge", "1 when the rank answered the status request"},
      {"braid_ops_total", "counter", "calls the rank completed on the communicator"},
      {"braid_ops_failed_total", "counter", "calls that failed"},
      {"braid_bytes_total", "counter", "bytes of the completed calls"},
      {"braid_open_ops", "gauge", "calls enqueued and not finished"},
      {"braid_oldest_wait_seconds", "gauge", "how long the oldest unfinished call has waited"}};
  uint64_t id = 0;
  for (int r = 0; r < job->nranks && id == 0; r++)
    if (job->now[r].answered) id = job->now[r].w.comm_id;
  for (size_t k = 0; k < sizeof(metrics) / sizeof(metrics[0]); k++) {
    if (first)
      strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", metrics[k][0], metrics[k][2],
                    metrics[k][0], metrics[k][1]);
    for (int r = 0; r < job->nranks; r++) {
      const struct status_rank* s = &job->now[r];
      const struct flight_wire* w = &s->w;
      if (!s->answered && k > 0) continue;
      uint64_t open = 0;
      int64_t oldest = 0;
      for (uint32_t i = 0; i < w->nentries; i++)
        if (w->entries[i].state == FLIGHT_QUEUED || w->entries[i].state == FLIGHT_RUNNING)
          open++, oldest = MAX(oldest, w->entries[i].enq_age_ms);
      double v[] = {s->answered,           (double)w->ops_done, (double)w->ops_failed,
                    (double)w->bytes_done, (double)open,        oldest / 1e3};
      strbuf_printf(out, "%s{comm=\"%016" PRIx64 "\",rank=\"%d\",host=", metrics[k][0], id, r);
      strbuf_json_string(out, s->answered ? w->host : ""); /* the same escapes as Prometheus' */
      strbuf_printf(out, "} %.17g\n", v[k]);
    }
  }
}

void status_report(const struct status_job* job, uint32_t what, int first, struct strbuf* out) {
  if (what == STATUS_PROMETHEUS) {
    report_prometheus(job, first, out);
    return;
  }
  struct strbuf verdict = {0};
  status_verdict(job, &verdict);
  if (what == STATUS_JSON)
    report_json(job, verdict.s ? verdict.s : "", out);
  else
    strbuf_printf(out, "%s", verdict.s ? verdict.s : "");
  strbuf_free(&verdict);
}

ncclResult_t status_of(const struct status_target* t, uint32_t what, int first,
                       struct strbuf* out) {
  struct status_job job;
  ncclResult_t res = status_gather(t, STATUS_GAP_MS, STATUS_ROUND_MS, &job);
  if (res != ncclSuccess) return res;
  status_report(&job, what, first, out);
  status_job_free(&job);
  return out->failed ? ncclSystemError : ncclSuccess;
}
