/*
 * A comm's control channel: a listener of its own, opened at init, whose
 * address every rank publishes with its peer info. It carries messages
 * that must reach some ranks without the others, such as the id of the
 * communicator ncclCommShrink makes for the survivors of a failure: the
 * comm's data connections may be broken and its collectives need the
 * excluded ranks. A message is one fixed-size hello on a fresh connection,
 * answered by one byte once the receiver took it.
 *
 * A message is taken only from the member it names as its sender: it
 * carries a keyed hash of itself under the comm's data secret (which never
 * travels), it comes from the IP address that member published, and, when
 * it comes from this host, from that member's process (socket_peer.h). So
 * neither a stranger nor another member can speak for a rank.
 */
#ifndef BRAID_COMM_CTRL_H_
#define BRAID_COMM_CTRL_H_

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;
union socket_addr;

#define CTRL_MAGIC 0x4c525443u /* "CTRL" */

/* SHRINK, GROW: an id for a new comm (ctrl_send_id, ctrl_recv). STATUS: a
 * member asks for this rank's flight recorder (status_service.c answers:
 * its size, then the snapshot). */
enum ctrl_kind { CTRL_SHRINK = 1, CTRL_GROW = 2, CTRL_STATUS = 3 };

#define CTRL_HELLO_MS 5000 /* a connection sends its whole message within this */
#define CTRL_ACK 'A'

struct ctrl_msg {
  uint32_t magic;
  uint32_t kind;  /* enum ctrl_kind */
  uint64_t proof; /* keyed hash of the message (proof 0) under the comm's data secret */
  uint64_t epoch; /* which use of this kind on the comm (its ranks count alike) */
  int32_t from;   /* sender's rank in the comm */
  int32_t reserved;
  ncclUniqueId id; /* the new comm's id */
};

/* Control messages the status service (status_service.h), which then
 * serves the comm's listener, keeps for ctrl_recv. */
#define CTRL_MAILBOX 8
struct ctrl_mailbox {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int served; /* set once, before any ctrl_recv: the service takes the messages */
  int n;
  struct ctrl_msg msgs[CTRL_MAILBOX];
};

/* Set m->proof for the comm with `secret` (public for the tests that
 * forge a message as a stranger holding the secret would). */
void ctrl_msg_seal(struct ctrl_msg* m, uint64_t secret);

/* Why message m, read from connection fd, is not from a member of comm
 * (NULL: it is): its magic, its sender's rank, its proof, and that it came
 * from the address that member published and, on this host, its process. */
const char* ctrl_check(const struct ncclComm* comm, int fd, const struct ctrl_msg* m);

/* Open the comm's listener on `where` (port 0: any; the port is written
 * back) into comm->ctrl_fd. */
ncclResult_t ctrl_listen(struct ncclComm* comm, union socket_addr* where);

/* Send a message of `kind` carrying `id` to every rank of the comm but
 * this one and those `skip` marks (NULL: none), each on a connection from
 * this rank's control address, stopping at the first that cannot be
 * reached or does not take it. */
ncclResult_t ctrl_send_id(struct ncclComm* comm, uint32_t kind, uint64_t epoch,
                          const ncclUniqueId* id, const unsigned char* skip);

/* Wait for the message of `kind` and `epoch` from rank `from` (-1: any
 * rank of the comm); messages that are not it (a stranger, another rank,
 * an old epoch) are refused with a log line. Ends early, failing, when
 * the comm is aborted or destroyed (comm->closing). */
ncclResult_t ctrl_recv(struct ncclComm* comm, uint32_t kind, uint64_t epoch, int from,
                       struct ctrl_msg* out, uint64_t deadline_ns);

#endif /* BRAID_COMM_CTRL_H_ */
