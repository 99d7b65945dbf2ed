/*
 * SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed pseudo-random
 * function of 64 bits. What a secret vouches for is said with it, never
 * the secret itself: a name derived from a secret can be public (Unix
 * socket names show in /proc/net/unix), and a message's tag proves its
 * sender holds the secret without putting the secret on the wire.
 */
#ifndef BRAID_SIPHASH_H_
#define BRAID_SIPHASH_H_

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of `len` bytes at msg under the 128-bit key (k0, k1). */
uint64_t siphash24(uint64_t k0, uint64_t k1, const void* msg, size_t len);

#endif /* BRAID_SIPHASH_H_ */
