/*
 * One rank's snapshot fetched over its comm's control channel
 * (status_fetch.c), many at once in a round of a gather (status_gather.c).
 */
#ifndef BRAID_STATUS_FETCH_H_
#define BRAID_STATUS_FETCH_H_

#include <stddef.h>
#include <stdint.h>

#include "status/flight.h"
#include "status/status_gather.h"

/* One rank's snapshot on its way (status_fetch.c). */
enum status_fetch_stage {
  FETCH_CONNECTING = 0,
  FETCH_LENGTH,
  FETCH_BODY,
  FETCH_SEAL,
  FETCH_DONE,
  FETCH_FAILED
};
struct status_fetch {
  int fd, rank;
  enum status_fetch_stage stage;
  uint64_t deadline_ns, nonce, seal;
  uint32_t len;
  size_t got;
};

/* Start fetching rank r's snapshot into out (a failure is said in out). */
void status_fetch_open(const struct status_target* t, int r, uint64_t deadline_ns,
                       struct status_fetch* f, struct status_rank* out);
/* poll() said revents for f->fd (stage FETCH_CONNECTING: POLLOUT, else POLLIN). */
void status_fetch_step(const struct status_target* t, struct status_fetch* f, short revents,
                       struct status_rank* out);
/* Its deadline passed: said as silence. */
void status_fetch_expire(struct status_fetch* f, struct status_rank* out);

/* What a snapshot takes on the wire (its used entries only), and the
 * seal a rank's reply carries: a keyed hash under the comm's secret and
 * the request's nonce, so that only a member's fresh answer is taken. */
size_t status_wire_bytes(const struct flight_wire* w);
uint64_t status_reply_seal(uint64_t secret, uint64_t nonce, const void* snapshot, size_t bytes);

#endif /* BRAID_STATUS_FETCH_H_ */
