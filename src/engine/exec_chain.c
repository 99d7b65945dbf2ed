/*
 * Chains folded in one task (exec_chain.h).
 */
#include "engine/exec_chain.h"

#include <string.h>

#include "core.h"
#include "engine/executor.h"

static void give_slot(struct exec_ctx* ex, int slot) {
  if (slot >= 0) ex->free_slots[ex->nfree++] = slot;
}

static void hold_slot(struct exec_held* h, int slot) {
  if (slot >= 0) h->slots[h->nslots++] = slot;
}

/* Whether step st reduces with the carry of its register. */
static int reads_carry(const struct sched_step* st) {
  return sched_prim_reads_local(st->prim) && (st->flags & SCHED_LOCAL_CARRY);
}

int chain_defers(const struct exec_ctx* ex, const struct sched_step* st) {
  const struct exec_chain* c = &ex->chains[st->carry];
  if (st->prim != PRIM_RECV_REDUCE_CARRY || ex->args.mem != MEM_HOST) return 0;
  if (c->nsrcs > 0 && !(st->flags & SCHED_LOCAL_CARRY)) return 0;
  /* room for its local operand (if it starts the chain), what it received
   * and what its reader receives */
  if ((c->nsrcs ? c->nsrcs : 1) + 2 > KERN_TASK_MAX_SRCS) return 0;
  for (size_t j = ex->next_compute + 1; j < ex->next_post; j++) {
    const struct sched_step* sj = &ex->sched->steps[j];
    if (sj->carry == st->carry && reads_carry(sj)) return 1;
  }
  return 0;
}

void chain_defer(struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec,
                 const void* local, unsigned pre, const void* received) {
  struct exec_chain* c = &ex->chains[st->carry];
  int* carry = &ex->carry[st->carry];
  if (c->nsrcs == 0) {
    memset(c, 0, sizeof(*c));
    c->srcs[0] = local;
    c->pre = pre ? 1u : 0u;
    c->nsrcs = 1;
    if ((st->flags & SCHED_LOCAL_CARRY) && *carry >= 0) hold_slot(&c->held, *carry);
    if (st->flags & SCHED_LOCAL_CARRY) *carry = -1;
  }
  if (!(st->flags & SCHED_LOCAL_FIRST)) c->swap |= 1u << c->nsrcs;
  c->srcs[c->nsrcs++] = received;
  if (rec->lent) { /* the message stays where it is; the slot for the result is not needed */
    c->held.lent_peer[c->held.nlent] = st->recv_peer;
    c->held.lent_seq[c->held.nlent++] = rec->recv_seq;
    rec->lent = 0;
    give_slot(ex, rec->slot);
  } else {
    hold_slot(&c->held, rec->slot);
  }
  rec->slot = -1;
}

int chain_read_by(const struct exec_ctx* ex, const struct sched_step* st) {
  return reads_carry(st) && ex->chains[st->carry].nsrcs > 0;
}

void chain_fold(const struct exec_ctx* ex, const struct sched_step* st, struct kern_task* t) {
  const struct exec_chain* c = &ex->chains[st->carry];
  int first = (st->flags & SCHED_LOCAL_FIRST) != 0;
  const void* received = first ? t->srcs[1] : t->srcs[0]; /* task_with_local's pair */
  memcpy(t->srcs, c->srcs, sizeof(c->srcs[0]) * (size_t)c->nsrcs);
  t->srcs[c->nsrcs] = received;
  t->nsrcs = c->nsrcs + 1;
  t->pre = c->pre;
  t->swap = c->swap | (first ? 0u : 1u << c->nsrcs);
}

void chain_take(struct exec_ctx* ex, const struct sched_step* st, struct exec_held* into) {
  struct exec_chain* c = &ex->chains[st->carry];
  *into = c->held;
  memset(c, 0, sizeof(*c));
}

ncclResult_t held_release(struct exec_ctx* ex, struct exec_held* h) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < h->nslots; i++) give_slot(ex, h->slots[i]);
  h->nslots = 0;
  for (int i = 0; i < h->nlent; i++) {
    struct transport_conn* c = ex->conf.recv_conns[h->lent_peer[i]];
    ncclResult_t r = c->ops->lend_return(c, h->lent_seq[i]);
    if (res == ncclSuccess) res = r;
  }
  h->nlent = 0;
  return res;
}

/* The oldest receive from `peer` that `h` holds, or UINT64_MAX. */
static uint64_t oldest_held(const struct exec_held* h, int peer) {
  uint64_t oldest = UINT64_MAX;
  for (int i = 0; i < h->nlent; i++)
    if (h->lent_peer[i] == peer) oldest = MIN(oldest, h->lent_seq[i]);
  return oldest;
}

int held_span_full(const struct exec_ctx* ex, int peer) {
  uint64_t oldest = UINT64_MAX;
  for (int i = 0; i < SCHED_CARRIES; i++)
    oldest = MIN(oldest, oldest_held(&ex->chains[i].held, peer));
  for (size_t i = ex->retired; i < ex->next_post; i++)
    oldest = MIN(oldest, oldest_held(&ex->recs[i % (size_t)ex->window].held, peer));
  return oldest != UINT64_MAX && ex->conf.recv_conns[peer]->posted >= oldest + TRANSPORT_LEND_SPAN;
}

void chains_reset(struct exec_ctx* ex) {
  for (int i = 0; i < SCHED_CARRIES; i++) {
    give_slot(ex, ex->carry[i]);
    ex->carry[i] = -1;
    for (int k = 0; k < ex->chains[i].held.nslots; k++) give_slot(ex, ex->chains[i].held.slots[k]);
    memset(&ex->chains[i], 0, sizeof(ex->chains[i]));
  }
}
