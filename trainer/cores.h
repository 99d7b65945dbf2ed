/* How a rank uses its host's cores. With a core per rank, Braid's threads may poll longer
 * before sleeping. Where ranks outnumber cores ("sharing"), each rank pins itself to one core
 * and offers that core to the rank beside it between layers and between gradient pieces.
 *
 * Why turns: the kernel hands a core to one of two busy ranks for a whole tick (4 ms at
 * HZ=250), about one rank's entire step here, so one rank of each pair reached the gradient
 * all-reduce a tick before the other and waited for it there. Taking turns at layer
 * granularity keeps the pair level, so both arrive together. Pinning keeps each pair on one
 * core instead of letting the balancer leave a core idle while a woken thread queues on the
 * other. */
#ifndef TRAIN_CORES_H_
#define TRAIN_CORES_H_

#include <stddef.h>

#include "launch.h"

typedef enum { SHARE_AUTO, SHARE_ON, SHARE_OFF } share_mode_t; /* --share-cores */

typedef struct {
  int sharing;    /* pinned and taking turns */
  char note[200]; /* what pinning did, when sharing */
} cores_t;

/* Decides, and applies to every thread of the process: pinning (only when the launcher left
 * the rank unbound), turns, and a polling time for the library (BRAID_SPIN_US, unless set).
 * Call before the communicator exists so Braid's threads inherit the pinning. */
void cores_plan(cores_t* c, const launch_t* l, share_mode_t mode);

/* Offers the core to another runnable thread: what a rank calls between layers when sharing. */
void cores_turn(void);

#endif /* TRAIN_CORES_H_ */
