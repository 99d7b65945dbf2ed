/*
 * The executor's backend on host memory (exec_cpu.c): tasks run at once
 * by the CPU kernels.
 */
#ifndef BRAID_EXEC_CPU_H_
#define BRAID_EXEC_CPU_H_

#include "engine/executor.h"

extern const struct exec_backend exec_backend_cpu;

#endif /* BRAID_EXEC_CPU_H_ */
