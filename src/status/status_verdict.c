/*
 * The verdict on a job's status (status_gather.h): from every rank's two
 * snapshots, one line a person acts on, then what backs it, then a table
 * of the ranks. In order, the first that holds:
 *   a rank is gone; ranks called a collective differently; a rank failed;
 *   then, about the oldest collective some rank waits in: ranks that have
 *   not called it (slow if they keep coming, stuck if not), ranks that do
 *   not answer, the call moving, a link that carries nothing;
 *   else a send or receive that waits, else nobody waits.
 * Collectives are compared by their own number (coll_seq), which every
 * rank counts alike; ages come from each rank's own clock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "status/flight.h"
#include "status/flight_names.h"
#include "status/status_verdict.h"
#include "strbuf.h"

#define HISTORY 8 /* a rank's last collectives its calling period is taken over */

static int is_open(const struct flight_wire_entry* e) {
  return e->state == FLIGHT_QUEUED || e->state == FLIGHT_RUNNING;
}

static const struct flight_wire* said(const struct status_job* job, int r) {
  return job->now[r].answered ? &job->now[r].w : NULL;
}

/* The rank's oldest unfinished operation (a collective if coll), or NULL. */
static const struct flight_wire_entry* oldest_open(const struct flight_wire* w, int coll) {
  for (uint32_t i = 0; w && i < w->nentries; i++)
    if (is_open(&w->entries[i]) && (!coll || w->entries[i].kind == FLIGHT_COLL))
      return &w->entries[i];
  return NULL;
}

static const struct flight_wire_entry* coll_entry(const struct flight_wire* w, uint64_t cs) {
  for (uint32_t i = 0; w && i < w->nentries; i++)
    if (w->entries[i].kind == FLIGHT_COLL && w->entries[i].coll_seq == cs) return &w->entries[i];
  return NULL;
}

static const struct flight_wire_entry* last_ended(const struct flight_wire* w) {
  for (uint32_t i = w ? w->nentries : 0; i > 0; i--)
    if (!is_open(&w->entries[i - 1])) return &w->entries[i - 1];
  return NULL;
}

/* Ranks marked in `set` as "0-4, 6" into out, "..." where it runs out. */
static void rank_list(const unsigned char* set, int n, char* out, size_t cap) {
  size_t o = 0;
  out[0] = '\0';
  for (int r = 0; r < n; r++) {
    if (!set[r]) continue;
    if (o + 32 >= cap) {
      snprintf(out + o, cap - o, ", ...");
      return;
    }
    int e = r;
    while (e + 1 < n && set[e + 1]) e++;
    o += (size_t)snprintf(out + o, cap - o, "%s%d", o ? ", " : "", r);
    if (e > r) o += (size_t)snprintf(out + o, cap - o, "%s%d", e == r + 1 ? ", " : "-", e);
    r = e;
  }
}

/* "rank 1" or "ranks 0-3" (and the verb's form) for a list. */
static const char* plural(const char* list) {
  return strpbrk(list, ",-") ? "s" : "";
}

/* "1.5 MiB" */
static void size_text(uint64_t bytes, char* out, size_t cap) {
  if (bytes >= (1u << 20))
    snprintf(out, cap, "%.1f MiB", bytes / 1048576.0);
  else if (bytes >= 1024)
    snprintf(out, cap, "%.1f KiB", bytes / 1024.0);
  else
    snprintf(out, cap, "%" PRIu64 " B", bytes);
}

static void describe_op(const struct flight_wire_entry* e, char* out, size_t cap) {
  const char* name = flight_op_name(e->kind, e->coll);
  char size[32];
  size_text(e->bytes, size, sizeof(size));
  if (e->kind == FLIGHT_COLL)
    snprintf(out, cap, "%s #%" PRIu64 " (%s %s)", name, e->coll_seq, size,
             flight_type_name(e->type));
  else if (e->peer < 0)
    snprintf(out, cap, "%s from any rank (%s, tag %d)", name, size, e->tag);
  else if (e->tag >= 0)
    snprintf(out, cap, "%s %s rank %d (%s, tag %d)", name, e->kind == FLIGHT_SEND ? "to" : "from",
             e->peer, size, e->tag);
  else
    snprintf(out, cap, "%s %s rank %d (%s)", name, e->kind == FLIGHT_SEND ? "to" : "from", e->peer,
             size);
}

/* Did the rank move between the two snapshots? */
static int rank_moved(const struct status_job* job, int r) {
  const struct status_rank *a = &job->before[r], *b = &job->now[r];
  if (!a->answered || !b->answered) return 0;
  if (b->w.ops_done + b->w.ops_failed != a->w.ops_done + a->w.ops_failed ||
      b->w.next_seq != a->w.next_seq)
    return 1;
  for (uint32_t i = 0; i < b->w.nentries; i++) {
    const struct flight_wire_entry* e = &b->w.entries[i];
    for (uint32_t k = 0; is_open(e) && k < e->nlinks; k++)
      if (e->links[k].idle_ms >= 0 && e->links[k].idle_ms < job->gap_ms) return 1;
  }
  return 0;
}

/* ---- a rank gone, a disagreement, a failure ---- */

/* Why the ranks in `set` said nothing, ranks with the same reason on one
 * line ("ranks 4-7 took no connection ..."). */
static void say_whys(struct strbuf* b, const struct status_job* job, const unsigned char* set) {
  int n = job->nranks;
  unsigned char* left = malloc((size_t)n * 2);
  char list[256];
  if (left == NULL) return;
  unsigned char* same = left + n;
  memcpy(left, set, (size_t)n);
  for (int r = 0; r < n; r++) {
    if (!left[r]) continue;
    for (int q = 0; q < n; q++)
      same[q] = left[q] && strcmp(job->now[q].why, job->now[r].why) == 0, left[q] &= !same[q];
    rank_list(same, n, list, sizeof(list));
    strbuf_printf(b, "  rank%s %s %s\n", plural(list), list, job->now[r].why);
  }
  free(left);
}

static int say_gone(struct strbuf* b, const struct status_job* job) {
  int first = -1;
  for (int r = 0; r < job->nranks && first < 0; r++)
    if (!job->now[r].answered && strncmp(job->now[r].why, "gone", 4) == 0) first = r;
  if (first < 0) return 0;
  strbuf_printf(b, "rank %d is %s\n", first, job->now[first].why);
  for (int r = 0; r < job->nranks; r++) { /* when the others noticed, if they did */
    const struct flight_wire* w = said(job, r);
    if (w && w->last_error_code != ncclSuccess) {
      char at[40];
      flight_wall_time(w->last_error_wall_ms, at, sizeof(at));
      strbuf_printf(b, "  rank %d failed at %s: %s\n", r, at, w->last_error);
      break;
    }
  }
  unsigned char* rest = calloc((size_t)job->nranks, 1); /* the other silent ones */
  for (int r = first + 1; rest && r < job->nranks; r++) rest[r] = !job->now[r].answered;
  if (rest) say_whys(b, job, rest);
  free(rest);
  return 1;
}

static int same_call(const struct flight_wire_entry* a, const struct flight_wire_entry* e) {
  return e->coll == a->coll && e->count == a->count && e->type == a->type && e->op == a->op &&
         e->root == a->root;
}

#define WINDOW 1024 /* collectives back from the newest that are compared */
#define KINDS 8     /* different calls of one collective that are told apart */

/* The earliest collective (of the last WINDOW) two ranks called
 * differently, 0 if none: each rank's against the first rank's that made it. */
static uint64_t first_mismatch(const struct status_job* job) {
  uint64_t top = 0, cs = 0;
  for (int r = 0; r < job->nranks; r++)
    if (said(job, r)) top = MAX(top, said(job, r)->next_coll);
  const struct flight_wire_entry** first = calloc(WINDOW, sizeof(*first));
  if (first == NULL) return 0;
  for (int r = 0; r < job->nranks; r++) {
    const struct flight_wire* w = said(job, r);
    for (uint32_t i = 0; w && i < w->nentries; i++) {
      const struct flight_wire_entry* e = &w->entries[i];
      if (e->kind != FLIGHT_COLL || e->coll_seq + WINDOW <= top || e->coll_seq > top) continue;
      const struct flight_wire_entry** f = &first[e->coll_seq % WINDOW];
      if (*f == NULL)
        *f = e;
      else if (!same_call(*f, e) && (cs == 0 || e->coll_seq < cs))
        cs = e->coll_seq;
    }
  }
  free(first);
  return cs;
}

/* Ranks called collective #cs differently: the call most of them made is
 * taken as the intended one, the others are named. */
static int say_disagreement(struct strbuf* b, const struct status_job* job) {
  uint64_t cs = first_mismatch(job);
  if (cs == 0) return 0;
  int n = job->nranks, nkinds = 0, best = 0;
  const struct flight_wire_entry* kind[KINDS];
  int votes[KINDS] = {0};
  for (int r = 0; r < n; r++) {
    const struct flight_wire_entry* e = coll_entry(said(job, r), cs);
    int k = 0;
    while (e && k < nkinds && !same_call(kind[k], e)) k++;
    if (e == NULL || k == KINDS) continue;
    if (k == nkinds) kind[nkinds++] = e;
    if (++votes[k] > votes[best]) best = k;
  }
  unsigned char* marks = calloc((size_t)n, 2); /* the odd ones, then the majority */
  if (marks == NULL) return 0;
  char list[256], list2[256], what[96], theirs[96];
  int first = -1;
  for (int r = 0; r < n; r++) {
    const struct flight_wire_entry* e = coll_entry(said(job, r), cs);
    marks[r] = e && !same_call(kind[best], e);
    marks[n + r] = e && !marks[r];
    if (marks[r] && first < 0) first = r;
  }
  rank_list(marks, n, list, sizeof(list));
  rank_list(marks + n, n, list2, sizeof(list2));
  describe_op(kind[best], what, sizeof(what));
  describe_op(coll_entry(said(job, first), cs), theirs, sizeof(theirs));
  strbuf_printf(b, "rank%s %s called %s where rank%s %s called %s: the calls do not match\n",
                plural(list), list, theirs, plural(list2), list2, what);
  for (int r = first + 1; r < n; r++)
    if (marks[r]) {
      describe_op(coll_entry(said(job, r), cs), theirs, sizeof(theirs));
      strbuf_printf(b, "  rank %d called %s\n", r, theirs);
    }
  free(marks);
  return 1;
}

static int say_failure(struct strbuf* b, const struct status_job* job) {
  int who = -1;
  uint64_t when = UINT64_MAX;
  for (int r = 0; r < job->nranks; r++) {
    const struct flight_wire* w = said(job, r);
    if (w && w->last_error_code != ncclSuccess && w->last_error_wall_ms < when)
      who = r, when = w->last_error_wall_ms;
  }
  if (who < 0) return 0;
  const struct flight_wire* w = said(job, who);
  char at[40];
  flight_wall_time(when, at, sizeof(at));
  strbuf_printf(b, "rank %d failed first, at %s: %s%s%s\n", who, at,
                ncclGetErrorString((ncclResult_t)w->last_error_code), w->last_error[0] ? ": " : "",
                w->last_error);
  return 1;
}

/* ---- the oldest collective some rank waits in ---- */

struct view {
  const struct status_job* job;
  uint64_t cs;
  int n;
  unsigned char *waiting, *behind, *silent; /* one each per rank */
  int nbehind, nsilent, moved;
  int64_t waited; /* the longest wait in it, ms */
  const struct flight_wire_entry* ref;
  char what[96], waiting_list[256];
};

static int view_make(struct view* v, const struct status_job* job, uint64_t cs) {
  memset(v, 0, sizeof(*v));
  v->job = job, v->cs = cs, v->n = job->nranks;
  v->waiting = calloc((size_t)v->n, 3);
  if (v->waiting == NULL) return 0;
  v->behind = v->waiting + v->n, v->silent = v->waiting + 2 * v->n;
  for (int r = 0; r < v->n; r++) {
    const struct flight_wire* w = said(job, r);
    const struct flight_wire_entry* e = coll_entry(w, cs);
    v->waiting[r] = e && is_open(e);
    v->behind[r] = w && w->next_coll < cs;
    v->silent[r] = w == NULL;
    v->nbehind += v->behind[r], v->nsilent += v->silent[r];
    if (v->waiting[r]) v->waited = MAX(v->waited, e->enq_age_ms), v->ref = v->ref ? v->ref : e;
    v->moved |= rank_moved(job, r);
  }
  describe_op(v->ref, v->what, sizeof(v->what));
  rank_list(v->waiting, v->n, v->waiting_list, sizeof(v->waiting_list));
  return 1;
}

/* How often rank r calls collectives (ms between its last few), -1 unknown. */
static int64_t call_period_ms(const struct flight_wire* w) {
  int64_t newest = -1, oldest = -1;
  int k = 0;
  for (uint32_t i = w->nentries; i > 0 && k < HISTORY; i--) {
    const struct flight_wire_entry* e = &w->entries[i - 1];
    if (e->kind != FLIGHT_COLL) continue;
    if (k++ == 0) newest = e->enq_age_ms;
    oldest = e->enq_age_ms;
  }
  return k >= 2 ? (oldest - newest) / (k - 1) : -1;
}

/* A rank not at the collective yet is slow, not stuck, when it moved
 * between the snapshots or it has been away no longer than it usually is. */
static int rank_slow(const struct view* v, int r, int64_t* period, int64_t* away) {
  const struct flight_wire* w = said(v->job, r);
  const struct flight_wire_entry* o = oldest_open(w, 0);
  const struct flight_wire_entry* l = last_ended(w);
  *period = call_period_ms(w);
  *away = o ? o->enq_age_ms : l ? l->end_age_ms : -1;
  if (rank_moved(v->job, r)) return 1;
  return *period >= 0 && *away >= 0 && *away <= MAX(2 * *period, (int64_t)v->job->gap_ms);
}

static void say_where(struct strbuf* b, const struct view* v, int r) {
  const struct flight_wire* w = said(v->job, r);
  const struct flight_wire_entry* o = oldest_open(w, 0);
  const struct flight_wire_entry* l = last_ended(w);
  char d[96];
  if (o) {
    describe_op(o, d, sizeof(d));
    strbuf_printf(b, "  rank %d (pid %d on %s) waits in %s for %.1f s\n", r, w->pid, w->host, d,
                  o->enq_age_ms / 1e3);
  } else if (l) {
    describe_op(l, d, sizeof(d));
    strbuf_printf(
        b, "  rank %d (pid %d on %s) is outside Braid: its last call, %s, returned %.1f s ago\n", r,
        w->pid, w->host, d, l->end_age_ms / 1e3);
  } else {
    strbuf_printf(b, "  rank %d (pid %d on %s) has made no call on this communicator\n", r, w->pid,
                  w->host);
  }
}

static void say_behind(struct strbuf* b, const struct view* v) {
  unsigned char* stuck = calloc((size_t)v->n, 1);
  char list[256];
  int nstuck = 0;
  int64_t period = -1, away = -1;
  if (stuck == NULL) return;
  for (int r = 0; r < v->n; r++)
    if (v->behind[r] && !rank_slow(v, r, &period, &away)) stuck[r] = 1, nstuck++;
  if (nstuck) {
    rank_list(stuck, v->n, list, sizeof(list));
    strbuf_printf(b, "rank%s %s %s not called %s; rank%s %s %s waited %.1f s\n", plural(list), list,
                  *plural(list) ? "have" : "has", v->what, plural(v->waiting_list), v->waiting_list,
                  *plural(v->waiting_list) ? "have" : "has", v->waited / 1e3);
  }
  for (int r = 0; r < v->n; r++) {
    if (!v->behind[r]) continue;
    if (stuck[r]) {
      say_where(b, v, r);
      continue;
    }
    rank_slow(v, r, &period, &away);
    strbuf_printf(b,
                  "%srank %d is slow, not stuck: it calls every %.2f s and has been away %.2f s; "
                  "rank%s %s wait%s for it in %s (%.1f s)\n",
                  nstuck ? "  " : "", r, period / 1e3, away / 1e3, plural(v->waiting_list),
                  v->waiting_list, *plural(v->waiting_list) ? "" : "s", v->what, v->waited / 1e3);
  }
  free(stuck);
}

/* The receive link of a waiting rank idle longest, from a peer in `from`
 * (NULL: any): *who waits on it. */
static const struct flight_wire_link* idlest_link(const struct view* v, const unsigned char* from,
                                                  int* who) {
  const struct flight_wire_link* best = NULL;
  for (int r = 0; r < v->n; r++) {
    const struct flight_wire_entry* e = v->waiting[r] ? coll_entry(said(v->job, r), v->cs) : NULL;
    for (uint32_t i = 0; e && i < e->nlinks; i++) {
      const struct flight_wire_link* l = &e->links[i];
      if (l->dir != 0 || l->posted <= l->done || (from && !from[l->peer])) continue;
      if (best == NULL || l->idle_ms > best->idle_ms) best = l, *who = r;
    }
  }
  return best;
}

static void say_link(struct strbuf* b, const struct view* v, int who,
                     const struct flight_wire_link* l, const char* indent) {
  char size[32];
  size_text(l->posted - l->done, size, sizeof(size));
  strbuf_printf(b, "%srank %d waits for %s from rank %d over %s, nothing moved for %.1f s\n",
                indent, who, size, l->peer, flight_transport_name(l->transport), l->idle_ms / 1e3);
  const struct flight_wire_entry* pe = coll_entry(said(v->job, l->peer), v->cs);
  for (uint32_t i = 0; pe && i < pe->nlinks; i++) {
    const struct flight_wire_link* s = &pe->links[i];
    if (s->dir != 1 || s->peer != who) continue;
    size_text(s->posted - s->done, size, sizeof(size));
    strbuf_printf(
        b, "  rank %d has %s for rank %d not yet through, stalled %.1f s: %s\n", l->peer, size, who,
        s->idle_ms / 1e3,
        s->posted > s->done ? "the link between them carries nothing" : "it sent what it had");
  }
}

static void say_silent(struct strbuf* b, const struct view* v) {
  char list[256];
  int who = -1;
  rank_list(v->silent, v->n, list, sizeof(list));
  strbuf_printf(b, "rank%s %s do%s not answer; rank%s %s %s waited %.1f s in %s\n", plural(list),
                list, *plural(list) ? "" : "es", plural(v->waiting_list), v->waiting_list,
                *plural(v->waiting_list) ? "have" : "has", v->waited / 1e3, v->what);
  say_whys(b, v->job, v->silent);
  const struct flight_wire_link* l = idlest_link(v, v->silent, &who);
  if (l) say_link(b, v, who, l, "  ");
}

static void say_collective(struct strbuf* b, const struct status_job* job, uint64_t cs) {
  struct view v;
  int who = -1;
  if (!view_make(&v, job, cs)) {
    strbuf_printf(b, "out of memory\n");
    return;
  }
  const struct flight_wire_link* l;
  if (v.nbehind)
    say_behind(b, &v);
  else if (v.nsilent)
    say_silent(b, &v);
  else if (v.moved)
    strbuf_printf(b, "%s is moving: no rank is stuck (rank%s %s in it for up to %.1f s)\n", v.what,
                  plural(v.waiting_list), v.waiting_list, v.waited / 1e3);
  else if ((l = idlest_link(&v, NULL, &who)) != NULL)
    say_link(b, &v, who, l, "");
  else
    strbuf_printf(b, "every rank is in %s and nothing moves (rank%s %s, %.1f s)\n", v.what,
                  plural(v.waiting_list), v.waiting_list, v.waited / 1e3);
  free(v.waiting);
}

/* ---- no collective waits ---- */

static void say_p2p(struct strbuf* b, const struct status_job* job) {
  for (int r = 0; r < job->nranks; r++) {
    const struct flight_wire_entry* e = oldest_open(said(job, r), 0);
    if (e == NULL) continue;
    char d[96];
    describe_op(e, d, sizeof(d));
    strbuf_printf(b, "rank %d waits in %s for %.1f s%s\n", r, d, e->enq_age_ms / 1e3,
                  rank_moved(job, r) ? " (moving)" : "");
    const struct flight_wire* pw =
        e->peer >= 0 && e->peer < job->nranks ? said(job, e->peer) : NULL;
    int matched = 0;
    for (uint32_t i = 0; pw && i < pw->nentries; i++) {
      const struct flight_wire_entry* p = &pw->entries[i];
      matched |= is_open(p) && p->peer == r &&
                 p->kind == (e->kind == FLIGHT_SEND ? FLIGHT_RECV : FLIGHT_SEND);
    }
    if (pw && !matched)
      strbuf_printf(b, "  rank %d has no %s %s rank %d pending: it has not called it\n", e->peer,
                    e->kind == FLIGHT_SEND ? "receive" : "send",
                    e->kind == FLIGHT_SEND ? "from" : "to", r);
    return;
  }
  strbuf_printf(b, "no rank waits in Braid: the job is between calls\n");
}

/* ---- the table ---- */

static void rank_row(struct strbuf* b, const struct status_job* job, int r) {
  const struct status_rank* s = &job->now[r];
  char d[96];
  if (!s->answered) {
    strbuf_printf(b, "  %4d  %-16s %8s  no answer: %s\n", r, "?", "?", s->why);
    return;
  }
  strbuf_printf(b, "  %4d  %-16s %8d  ", r, s->w.host, s->w.pid);
  if (s->w.last_error_code != ncclSuccess)
    strbuf_printf(b, "failed (%s); ", ncclGetErrorString((ncclResult_t)s->w.last_error_code));
  const struct flight_wire_entry* e = oldest_open(&s->w, 0);
  if (e == NULL) {
    const struct flight_wire_entry* l = last_ended(&s->w);
    if (l) describe_op(l, d, sizeof(d));
    strbuf_printf(b, "idle, %" PRIu64 " calls done%s%s\n", s->w.ops_done, l ? "; last " : "",
                  l ? d : "");
    return;
  }
  describe_op(e, d, sizeof(d));
  strbuf_printf(b, "%s %s %.1f s", d, flight_state_name(e->state), e->enq_age_ms / 1e3);
  int pending = 0; /* the links it waits on: bytes asked for and not yet through */
  for (uint32_t i = 0; i < e->nlinks; i++) {
    const struct flight_wire_link* l = &e->links[i];
    if (l->posted <= l->done) continue;
    char size[32];
    size_text(l->posted - l->done, size, sizeof(size));
    strbuf_printf(b, "%s %s %s rank %d over %s, idle %.1f s", pending++ ? "," : ";", size,
                  l->dir ? "to" : "from", l->peer, flight_transport_name(l->transport),
                  l->idle_ms / 1e3);
  }
  strbuf_printf(b, "\n");
}

void status_verdict(const struct status_job* job, struct strbuf* b) {
  uint64_t cs = 0;
  uint64_t id = 0;
  for (int r = 0; r < job->nranks && id == 0; r++)
    if (job->now[r].answered) id = job->now[r].w.comm_id;
  strbuf_printf(b, "comm %016" PRIx64 ", %d ranks: ", id, job->nranks);
  for (int r = 0; r < job->nranks; r++) {
    const struct flight_wire_entry* e = oldest_open(said(job, r), 1);
    if (e && (cs == 0 || e->coll_seq < cs)) cs = e->coll_seq;
  }
  if (say_gone(b, job) || say_disagreement(b, job) || say_failure(b, job))
    ;
  else if (cs)
    say_collective(b, job, cs);
  else
    say_p2p(b, job);
  strbuf_printf(b, "  rank  host                  pid  state\n");
  for (int r = 0; r < job->nranks; r++) rank_row(b, job, r);
}
