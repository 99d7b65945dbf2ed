/*
 * Environment parameters. Each is read once, on first use, and logged at
 * INFO/ENV when set; the README's table lists them with their defaults.
 */
#ifndef BRAID_PARAM_H_
#define BRAID_PARAM_H_

#include <stdint.h>

/* Parse "123", "64K", "8M", "1G" (powers of 1024). Returns 0 on success. */
int param_parse_int(const char* s, int64_t* out);

/* Integer parameter `env` (or `dflt` when unset or malformed, with a WARN). */
int64_t param_read_int(const char* env, int64_t dflt);

/* An integer parameter clamped to [lo, hi], with a WARN when it was not
 * inside; param_clamp does the same to a value read some other way. */
int64_t param_read_range(const char* env, int64_t dflt, int64_t lo, int64_t hi);
int64_t param_clamp(const char* env, int64_t v, int64_t lo, int64_t hi);

/* String parameter, NULL when unset. */
const char* param_read_str(const char* env);

/* The smallest pipeline chunk: below it per-message costs dominate. */
#define PARAM_CHUNK_MIN 4096

/* The library's integer knobs, each cached after the first call and
 * clamped to its range (README, "Environment"). */
int64_t param_timeout_ms(void);       /* BRAID_TIMEOUT_MS */
int64_t param_socket_nthreads(void);  /* NCCL_SOCKET_NTHREADS */
int64_t param_nsocks_perthread(void); /* NCCL_NSOCKS_PERTHREAD */
int64_t param_chunk_size(void);       /* BRAID_CHUNK_SIZE */
int64_t param_nsteps(void);           /* BRAID_NSTEPS */
int64_t param_spin_us(void);          /* BRAID_SPIN_US */
int64_t param_sock_buf(void);         /* BRAID_SOCKET_BUF */
int64_t param_shm_disable(void);      /* NCCL_SHM_DISABLE */

#endif /* BRAID_PARAM_H_ */
