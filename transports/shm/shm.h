/*
 * The shared-memory transport's connection, shared by its two halves:
 * shm_connect.c makes and checks the segments, shm.c moves the messages
 * through them. One segment per (sender, receiver, channel): a header, a
 * descriptor per slot, then the slots' data.
 */
#ifndef BRAID_SHM_H_
#define BRAID_SHM_H_

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"
#include "shm_names.h"
#include "transport.h"

#define SHM_LINE 64
/* The longest nap of a side that polls its peer: connect_recv waiting for
 * the segment, a closing sender waiting for the receiver to take its slots. */
#define SHM_POLL_MAX_US 1000

enum { SHM_SEND = 0, SHM_RECV = 1 };
enum { SHM_SLOT_COPY = 1, SHM_SLOT_DIRECT = 2 };

/* Both processes touch these words at once: they must be lock-free. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory counters need lock-free atomics");
/* The start of every segment. */
struct shm_header {
  /* Set by the sender before `ready`, read-only afterwards. */
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  uint64_t map_bytes;
  uint32_t nslots;
  uint32_t slot_bytes;
  int32_t sender_pid;
  int32_t sender_rank;
  int32_t receiver_rank;
  int32_t channel;
  uint64_t sender_addr; /* this header in the sender's address space: the direct-read probe */
  _Atomic uint32_t ready;
  /* Set by the receiver before `attached`. */
  _Atomic int32_t receiver_pid; /* for whoever inspects a segment */
  _Atomic uint32_t direct_ok;   /* its process_vm_readv probe of the sender worked */
  _Atomic uint32_t attached;
  _Atomic uint32_t closed[2]; /* [SHM_SEND], [SHM_RECV]: that side shut down or closed */
  /* The two sides write these concurrently: one cache line each. */
  alignas(SHM_LINE) _Atomic uint64_t head; /* slots produced */
  alignas(SHM_LINE) _Atomic uint64_t tail; /* slots consumed */
  alignas(SHM_LINE) _Atomic uint32_t bell; /* futex word, bumped after every head/tail move */
  _Atomic uint32_t sleepers;               /* threads that may sleep on bell */
  /* [side]: that side's threads asleep in epoll while blocked here (they
   * wait for sockets too), and whether the other side can ring their bell
   * pipe; then it does so after every bump while any sleep there. */
  _Atomic uint32_t fd_sleepers[2];
  _Atomic uint32_t fd_ringable[2];
};

/* What a slot holds; its own cache line so that the sender filling slot k+1
 * does not disturb the receiver reading slot k. */
struct shm_slot {
  alignas(SHM_LINE) uint32_t kind;
  uint32_t bytes;           /* copy: payload in this slot */
  uint64_t msg_bytes;       /* the whole message: checked against what the receiver posted */
  uint64_t seq;             /* message number */
  uint64_t addr;            /* direct: the message in the sender's address space */
  struct transport_tag tag; /* the call it belongs to: checked too */
};
_Static_assert(sizeof(struct shm_slot) == SHM_LINE, "one slot descriptor per cache line");

struct shm_msg {
  char* buf;
  size_t bytes;
  int direct;
  uint64_t ack; /* send, direct: complete once the tail reaches this slot count */
  struct transport_tag tag;
  int in_place; /* send: written straight into its slot (transport.h, send_space) */
  int lend;     /* receive: left in its slot for the reader (transport.h, lend_max) */
  int returned; /* receive, lent: the reader gave its slot back */
  uint64_t at;  /* receive, lent: its slot, counted as head and tail are */
};

struct shm_conn {
  struct transport_conn base;
  int side;
  int channel;
  pid_t peer_pid;
  char name[SHM_NAME_MAX];
  int named;        /* send: the name may still be in /dev/shm */
  _Atomic int shut; /* this side shut the connection down (maybe from an abort's thread) */
  int64_t timeout_ms;
  struct shm_header* hdr;
  struct shm_slot* slots;
  char* data;
  size_t map_bytes;
  uint32_t nslots;
  size_t slot_bytes;
  size_t direct_min;  /* send: 0 = never */
  int direct;         /* send: -1 until the receiver has attached, then its probe result */
  int direct_allowed; /* receive: this side's own say on direct reads (never the segment's) */
  struct transport_waits* waits;
  int peer_bell;     /* the peer's progress bell pipe, opened for writing; -1 if not */
  uint64_t head;     /* slots produced (the sender's own, the receiver's last look) */
  uint64_t tail;     /* slots freed (the receiver's own, the sender's last look) */
  uint64_t rd;       /* receive: slots read, copied out or lent; the tail stops at a lent one */
  uint64_t lent_lo;  /* receive: no message before this one is lent and not yet returned */
  uint32_t nlent;    /* receive: lent messages posted and not yet returned */
  uint64_t cur;      /* message now going through the slots */
  size_t cur_off;    /* bytes of it already moved */
  uint64_t alive_ns; /* next liveness check of the peer */
  uint64_t granted;  /* send: head + 1 when send_space gave out the slot at head, else 0 */
  _Atomic int miscounted; /* the peer lowered a sleeper count of ours: nap (transport.h) */
  int miscount_told;      /* ... and this side said so once */
  struct shm_msg msgs[TRANSPORT_MAX_INFLIGHT];
};

/* Tell the other side that head or tail moved, or a flag changed (shm.c). */
void shm_bell_ring(struct shm_conn* c);

/* Close a connection and free it (shm.c): a sender first waits, within the
 * timeout, until the receiver has taken every slot. */
void shm_close(struct transport_conn* base);

#endif /* BRAID_SHM_H_ */
