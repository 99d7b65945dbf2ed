/*
 * Plan, the first of a unit's three steps (work.h): each collective gets
 * its algorithm and chunk from the tuner, and with them the schedule key
 * that fixes which peers it talks to. Nothing is connected or sent here,
 * so a plan can be logged or simulated on its own.
 */
#include "engine/plan.h"

#include "comm/comm.h"
#include "engine/exec_plan.h"
#include "engine/work_op.h"

void work_plan(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++) {
    struct work_op* op = &ops[i];
    if (op->kind == WORK_COLL) {
      exec_plan(op->comm, &op->args, &op->key);
      if (op->direct == WORK_DIRECT_HIER) { /* Hier's links, and its column's (connect.c) */
        op->args.algo = ALGO_HIER;
        exec_key(op->comm, &op->args, &op->key);
      }
    } else
      op->reg = op->buf ? mem_reg_find(&op->comm->regs, op->buf, op->bytes) : NULL;
  }
}
