/*
 * The CPU grid emulation of the CUDA kernels: kernels/cuda/kern_body.h
 * compiled by the host compiler, run as `grid` blocks of `block` threads,
 * one after another. The kernel tests compare it with the CPU kernels, and
 * the simulated driver runs launches through it.
 */
#ifndef BRAID_KERN_EMULATE_H_
#define BRAID_KERN_EMULATE_H_

#include "cuda/kern_body.h"

void kern_emulate_reduce_copy(const struct kern_dev_task* t, unsigned grid, unsigned block);

/* braid_reduce_copy_at on a task already loaded: every row in turn (the
 * kernel's blocks step through the rows together; the rows are disjoint,
 * so one after another gives the same bytes). */
void kern_emulate_reduce_copy_at(const struct kern_dev_task* t, unsigned grid, unsigned block);

/* 16-byte vectors the fast path has sent to the exact path so far (a NaN
 * in a lane), in this process: the tests check that they reach the fix-up
 * and that numbers never need it. */
unsigned long kern_emulate_fixups(void);

/* The same as sm_80 compiles the kernel (fp8 through integer code, not the
 * conversion instructions of sm_89 and up), with its own fix-up count. */
void kern_emulate_reduce_copy_sm80(const struct kern_dev_task* t, unsigned grid, unsigned block);
unsigned long kern_emulate_fixups_sm80(void);

#endif
