/*
 * This host and process: what tells it apart from the others of a job
 * (every rank publishes it in the peer table), and random numbers from the
 * kernel (keys, secrets, segment tags).
 */
#ifndef BRAID_HOST_H_
#define BRAID_HOST_H_

#include <stdint.h>

/* Random 64-bit value from the kernel. */
uint64_t host_random64(void);

/* Host identity: NCCL_HOSTID if set, else hash of hostname and boot id. */
uint64_t host_hash(void);

/* Shared-memory domain: boot id, /dev/shm and pid namespace. */
uint64_t host_shm_domain(void);

#endif /* BRAID_HOST_H_ */
