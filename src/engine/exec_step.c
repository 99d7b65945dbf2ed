/*
 * A step's computation (exec_step.c): the task it posts, where it writes
 * what it sends, and how it hands its carry on. The executor (executor.c)
 * decides when.
 */
#include "engine/exec_step.h"

#include "core.h"

/* t = the one-source task dst = POST(PRE(src)), as kern_unary. */
int exec_task_unary(struct kern_task* t, const struct exec_args* a, unsigned flags, void* dst,
                    const void* src, size_t n) {
  t->redop = a->redop;
  t->pre = (flags & KERN_PRE) ? 1u : 0u;
  t->swap = 0;
  t->flags = flags & KERN_POST;
  t->nsrcs = t->ndsts = 1;
  t->n = n;
  t->srcs[0] = src;
  t->dsts[0] = dst;
  return 1;
}

/* t = the two-source task dst = POST(s0 OP PRE(s1)), as kern_reduce. */
static int task_pair(struct kern_task* t, const struct exec_args* a, unsigned flags, void* dst,
                     const void* s0, const void* s1, size_t n) {
  exec_task_unary(t, a, flags & KERN_POST, dst, s0, n);
  t->pre = (flags & KERN_PRE) ? 2u : 0u;
  t->nsrcs = 2;
  t->srcs[1] = s1;
  return 1;
}

/* The reduction of what arrived (r) with the local operand: r OP local,
 * or with SCHED_LOCAL_FIRST local OP r (the canonical order puts the lower
 * half's data first, algorithms/pairwise.h). `pre` applies to the local
 * operand either way. */
static int task_with_local(struct kern_task* t, const struct exec_args* a, unsigned step_flags,
                           unsigned pre, unsigned post, void* dst, const void* r, const void* local,
                           size_t n) {
  if (!(step_flags & SCHED_LOCAL_FIRST)) return task_pair(t, a, pre | post, dst, r, local, n);
  task_pair(t, a, post, dst, local, r, n);
  t->pre = pre ? 1u : 0u;
  return 1;
}

/* What a step reads: its slices of X and Y, its slot, what arrived, and
 * the local operand of its reduction, with the flags that apply. */
struct step_operands {
  const char* x;
  char* y;
  char* slot;
  const char* r;
  const char* src;
  const char* local;
  unsigned pre, post;
};

static void step_operands(const struct exec_ctx* ex, const struct sched_step* st,
                          const struct exec_rec* rec, struct step_operands* o) {
  const struct exec_args* a = &ex->args;
  o->x = (const char*)a->sendbuff + st->xoff * ex->es;
  o->y = (char*)a->recvbuff + st->yoff * ex->es;
  o->slot = rec->slot >= 0 ? exec_slot_ptr(ex, rec->slot) : NULL;
  const struct transport_conn* rc = st->recv_peer >= 0 ? ex->conf.recv_conns[st->recv_peer] : NULL;
  o->r = rec->lent ? rc->ops->lent(rc, rec->recv_seq) : o->slot; /* what arrived */
  int carry = ex->carry[st->carry], use_carry = (st->flags & SCHED_LOCAL_CARRY) && carry >= 0;
  /* a reduction whose pre-multiplied input a copy rounded into Y reads Y */
  int rounded = (st->flags & SCHED_PRE_ROUNDED) && a->pre && st->prim != PRIM_COPY;
  o->src = (st->flags & SCHED_LOCAL_OUT) || rounded ? o->y : o->x;
  o->local = use_carry ? exec_slot_ptr(ex, carry) : o->src;
  o->pre = (st->flags & SCHED_PRE) && !rounded ? a->pre : 0;
  o->post = (st->flags & SCHED_POST) ? a->post : 0;
}

/* What step `st` computes, into rec->task (returns 0 when it computes
 * nothing), and what it then sends, into rec->out. Changes nothing else:
 * the caller may find the task must wait, and plan it again later. */
static int step_task(const struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec) {
  const struct exec_args* a = &ex->args;
  size_t n = st->count;
  struct step_operands o;
  step_operands(ex, st, rec, &o);
  const char *r = o.r, *src = o.src, *local = o.local;
  char *y = o.y, *slot = o.slot;
  unsigned pre = o.pre, post = o.post;
  struct kern_task* t = &rec->task;
  rec->out = NULL;
  switch ((enum sched_prim)st->prim) {
    case PRIM_SEND: /* a slot: pre-multiplied or staged */
      rec->out = slot ? slot : src;
      return slot ? exec_task_unary(t, a, pre, slot, src, n) : 0;
    case PRIM_RECV: /* staged: into a slot first */
      return slot ? exec_task_unary(t, a, 0, y, slot, n) : 0;
    case PRIM_RECV_REDUCE_SEND: /* post: a reduce's last step sends the value to the root */
      rec->out = slot;
      return task_with_local(t, a, st->flags, pre, post, slot, r, local, n);
    case PRIM_RECV_REDUCE_CARRY:
      return task_with_local(t, a, st->flags, pre, 0, slot, r, local, n);
    case PRIM_RECV_REDUCE_COPY_SEND:
      rec->out = ex->staged ? slot : y;
      task_with_local(t, a, st->flags, pre, post, y, r, local, n);
      if (ex->staged) t->dsts[t->ndsts++] = slot; /* the result over R: one pass writes both */
      return 1;
    case PRIM_RECV_REDUCE_COPY:
      return task_with_local(t, a, st->flags, pre, post, y, r, local, n);
    case PRIM_RECV_COPY_SEND: /* staged: R lands in the slot, goes on from there */
      rec->out = slot ? slot : y;
      return slot ? exec_task_unary(t, a, 0, y, slot, n) : 0;
    case PRIM_SEND_OUT:
      rec->out = slot ? slot : y;
      return slot ? exec_task_unary(t, a, 0, slot, y, n) : 0;
    case PRIM_COPY:
      if ((st->flags & SCHED_PRE_ROUNDED) && !a->pre) return 0;
      return (pre | post) || src != y ? exec_task_unary(t, a, pre | post, y, src, n) : 0;
    case PRIM_LOAD_CARRY:
      return slot ? exec_task_unary(t, a, pre, slot, o.x, n) : 0;
    case PRIM_EXCHANGE: /* its send went out at post time */
      if (st->flags & SCHED_SWAP) return task_pair(t, a, post, y, r, y, n);
      return task_pair(t, a, post, y, y, r, n);
    default:
      return 0;
  }
}

/* step_task, the step's combine folding its register's chain (exec_chain.h)
 * where it reads one. */
int exec_step_plan(const struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec) {
  int has_task = step_task(ex, st, rec);
  if (has_task && chain_read_by(ex, st)) chain_fold(ex, st, &rec->task);
  return has_task;
}

/* A reduction whose result goes on to a peer writes it where that peer
 * reads it (transport.h, send_space) instead of into a slot or only into
 * Y, saving the copy out: on a host call, when the step is the first
 * unfinished one, so that its send is the next posted on its connection
 * (finish_step) and nothing else is posted there in between. */
void exec_step_send_in_place(const struct exec_ctx* ex, const struct sched_step* st,
                             struct exec_rec* rec) {
  if (ex->args.mem != MEM_HOST || ex->next_finish != ex->next_compute || rec->out == NULL) return;
  if (st->prim != PRIM_RECV_REDUCE_SEND && st->prim != PRIM_RECV_REDUCE_COPY_SEND) return;
  struct transport_conn* c = ex->conf.send_conns[st->send_peer];
  void* space = c->ops->send_space ? c->ops->send_space(c, st->count * ex->es) : NULL;
  if (space == NULL) return;
  if (st->prim == PRIM_RECV_REDUCE_SEND)
    rec->task.dsts[0] = space; /* instead of the slot, freed once the task is done */
  else
    rec->task.dsts[rec->task.ndsts++] = space; /* Y and the message in one pass */
  rec->out = space;
  rec->in_place = 1;
}

/* The planned step goes ahead: a reduction takes the carry it read (freed
 * when its task is done), a reduce-carry or load-carry step hands its
 * slot over as the next carry. */
void exec_step_commit_carry(struct exec_ctx* ex, const struct sched_step* st,
                            struct exec_rec* rec) {
  int* carry = &ex->carry[st->carry];
  if (chain_read_by(ex, st)) chain_take(ex, st, &rec->held);
  if (st->prim == PRIM_LOAD_CARRY && rec->slot >= 0) {
    *carry = rec->slot;
    rec->slot = -1;
  }
  if (!sched_prim_reads_local(st->prim)) return;
  if ((st->flags & SCHED_LOCAL_CARRY) && *carry >= 0) {
    rec->carry_in = *carry;
    *carry = -1;
  }
  if (st->prim == PRIM_RECV_REDUCE_CARRY) {
    *carry = rec->slot;
    rec->slot = -1;
  }
}

/* The reduce-carry step leaves its combine to the step that reads its
 * register (exec_chain.h). */
void exec_step_defer(struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec) {
  struct step_operands o;
  step_operands(ex, st, rec, &o);
  chain_defer(ex, st, rec, o.local, o.pre, o.r);
}
