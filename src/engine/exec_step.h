/*
 * A step's computation, as the executor runs it (exec_step.c).
 */
#ifndef BRAID_EXEC_STEP_H_
#define BRAID_EXEC_STEP_H_

#include "engine/executor.h"

/* t = the one-source task dst = POST(PRE(src)), as kern_unary. */
int exec_task_unary(struct kern_task* t, const struct exec_args* a, unsigned flags, void* dst,
                    const void* src, size_t n);
/* What step `st` computes, into rec->task (returns 0 when it computes
 * nothing: rec->task is then not set), folding its register's chain where
 * it reads one, and what it then sends, into rec->out. Changes nothing
 * else: the caller may find the task must wait, and plan it again later. */
int exec_step_plan(const struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec);
/* Where the planned task may write what it sends straight into the peer's
 * memory, point it there (rec->in_place). */
void exec_step_send_in_place(const struct exec_ctx* ex, const struct sched_step* st,
                             struct exec_rec* rec);
/* The planned step goes ahead: the carries it reads and leaves. */
void exec_step_commit_carry(struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec);
/* The reduce-carry step leaves its combine to its register's reader
 * (exec_chain.h) instead. */
void exec_step_defer(struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec);

#endif /* BRAID_EXEC_STEP_H_ */
