/*
 * A test-only algorithm (star.c), compiled into mp_test_rows alone: the
 * library's own algorithms' table takes it as a row where a test build
 * names it (BRAID_TEST_ALGORITHM, algorithms/sched_algos.c).
 */
#ifndef BRAID_TESTS_STAR_H_
#define BRAID_TESTS_STAR_H_

#include "sched_algos.h"

extern const struct sched_algorithm star_algorithm;

#endif /* BRAID_TESTS_STAR_H_ */
