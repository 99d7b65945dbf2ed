/*
 * A test-only transport (loop_transport.c), compiled into mp_test_rows
 * alone: the library's own transport table takes it as a row where a test
 * build names it (BRAID_TEST_TRANSPORT, transports/transport_table.c).
 */
#ifndef BRAID_TESTS_LOOP_TRANSPORT_H_
#define BRAID_TESTS_LOOP_TRANSPORT_H_

#include <stdint.h>

#include "transport.h"

/* Its id: the last the table allows, far from the library's own. */
#define LOOP_TRANSPORT_ID (TRANSPORT_MAX_ID - 1)

extern const struct transport loop_transport;

/* Messages this process's loop connections completed, both directions:
 * what a test reads to know the transport carried its calls. */
uint64_t loop_transport_messages(void);

#endif /* BRAID_TESTS_LOOP_TRANSPORT_H_ */
