/*
 * Planning a unit (plan.c): the first of its three steps (work.h).
 */
#ifndef BRAID_PLAN_H_
#define BRAID_PLAN_H_

#include "engine/work_op.h"

/* The tuner picks each collective's algorithm and chunk, which fixes its
 * schedule and so the peers it talks to. */
void work_plan(struct work_op* ops, int n);

#endif /* BRAID_PLAN_H_ */
