/*
 * The bootstrap root (bootstrap_root.c): one thread that reads every
 * connection's hello side by side, registers the ranks of its block that
 * hold the job key, and when all have come sends the table and the data
 * secret down the relay tree (the wire: bootstrap.h).
 */
#ifndef BRAID_BOOTSTRAP_ROOT_H_
#define BRAID_BOOTSTRAP_ROOT_H_

#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "nccl.h"
#include "socket.h"

/* Why a hello is refused (NULL: it is this job's); a key holder's hello is
 * then checked against the job by the root. Exposed for the fuzzer. */
const char* bootstrap_hello_stranger(const struct root_hello* h, uint64_t key);

/* Serve `key` on addr (port 0: any; the port taken is written back) until
 * nranks ranks (0: as many as the first hello says) have registered, or
 * the timeout. *out (when not NULL) lets the caller stop it early. When
 * the address cannot be had, *listen_err (when not NULL: no WARN then)
 * says why, as an errno value. */
ncclResult_t bootstrap_root_start(union socket_addr* addr, uint64_t key, int nranks,
                                  struct bootstrap_root** out, int* listen_err);
/* Stop waiting for ranks (registered ones are told) and let go of it. */
void bootstrap_root_release(struct bootstrap_root* root);
/* Wait until it is done (served or failed), and what it sent and
 * received; for the scaling measurements. */
void bootstrap_root_wait(struct bootstrap_root* root, struct bootstrap_counts* counts);
/* Let go of it while it serves on until its ranks came or its timeout. */
void bootstrap_root_detach(struct bootstrap_root* root);

#endif /* BRAID_BOOTSTRAP_ROOT_H_ */
