/*
 * The flight recorder (flight.c): every communicator keeps its last
 * operations, as they are enqueued, start, move and end, in memory it owns:
 * no system call per operation. What a hung job's status shows (status
 * service, braid-status), what a rank writes when it fails (BRAID_TRACE_DIR,
 * flight_json.h) and the per-operation records (BRAID_OP_LOG, flight_oplog.h)
 * all come from here. It knows calls as flight_call and connections as
 * transports' counters, not the comm or its ops (work_flight.c maps them).
 *
 * One thread writes an entry at a time (the one that issues the operation,
 * then the one that runs it); the status thread reads it at any time. The
 * fields that change after enqueue are atomics, and a reader copies an
 * entry and keeps the copy only if its sequence number did not change.
 */
#ifndef BRAID_FLIGHT_H_
#define BRAID_FLIGHT_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "status/flight_names.h"
#include "nccl.h"

struct transport_conn;

#define FLIGHT_LINKS 8
#define FLIGHT_WIRE_ENTRIES 64 /* a snapshot's entries at most: every unfinished one first */
#define FLIGHT_ERROR_LEN 160

/* One peer connection an operation uses, one way. */
struct flight_link {
  int32_t peer;
  uint8_t dir;                     /* 0: receives from peer, 1: sends to it */
  uint8_t transport;               /* enum transport_id, 255 unknown */
  struct transport_conn* conn;     /* the writer's only: never read by the status thread */
  uint64_t base_posted, base_done; /* the connection's byte counts when the operation started */
  _Atomic uint64_t posted, done;   /* bytes since: asked for (sends: given), and moved */
  _Atomic uint64_t moved_ns;       /* monotonic: the last time done changed */
};

struct flight_entry {
  _Atomic uint64_t seq; /* the operation's number on the comm, from 1; 0: never used */
  uint64_t coll_seq;    /* collectives: their own number (every rank's agree), else 0 */
  int32_t kind, coll, type, op, algo, root, peer, tag;
  uint64_t count, bytes;
  uint64_t enq_ns;
  _Atomic uint64_t start_ns, end_ns;
  _Atomic int32_t state, status;
  _Atomic uint32_t nlinks;
  uint64_t looked_ns; /* the writer's: when flight_progress last counted */
  struct flight_link links[FLIGHT_LINKS];
};

struct flight {
  struct flight_entry* ring;
  uint32_t cap;
  _Atomic uint64_t next_seq;  /* operations enqueued */
  _Atomic uint64_t next_coll; /* collectives enqueued */
  _Atomic uint64_t ops_done, ops_failed, bytes_done;
  pthread_mutex_t lock; /* the last error, the per-operation log */
  char last_error[FLIGHT_ERROR_LEN];
  int32_t last_error_code;
  uint64_t last_error_wall_ms; /* CLOCK_REALTIME */
  void* oplog;                 /* FILE*: BRAID_OP_LOG's, NULL when off */
  int oplog_tried;
  _Atomic int dumped; /* flight_dump wrote this comm's file */
  int inited;
  int precise; /* times from the precise clock (BRAID_OP_LOG), else the coarse one */
  int rank, nranks;
  uint64_t comm_id;
};

/* ---- what a rank tells of a comm: a snapshot, the same on every host ---- */

#define FLIGHT_WIRE_MAGIC 0x464c4954u /* "FLIT" */
#define FLIGHT_WIRE_VERSION 1u

struct flight_wire_link {
  int32_t peer;
  uint8_t dir, transport, pad[2];
  uint64_t posted, done; /* bytes */
  int64_t idle_ms;       /* since it last moved (since the operation started if never) */
};

/* Times are ages in ms at the snapshot (-1: not yet): hosts' clocks differ. */
struct flight_wire_entry {
  uint64_t seq, coll_seq;
  int32_t kind, coll, type, op, algo, root, peer, tag, state, status;
  uint32_t nlinks;
  uint64_t count, bytes;
  int64_t enq_age_ms, start_age_ms, end_age_ms;
  struct flight_wire_link links[FLIGHT_LINKS];
};

struct flight_wire {
  uint32_t magic, version;
  int32_t rank, nranks, pid;
  int32_t last_error_code;
  uint64_t comm_id; /* the same on every rank of the comm */
  uint64_t next_seq, next_coll;
  uint64_t ops_done, ops_failed, bytes_done;
  uint64_t now_wall_ms, last_error_wall_ms;
  char host[64];
  char last_error[FLIGHT_ERROR_LEN];
  uint32_t nentries;
  uint32_t pad;
  struct flight_wire_entry entries[FLIGHT_WIRE_ENTRIES];
};

/* What a call is, as the recorder keeps it (work_flight.c fills it). */
struct flight_call {
  int32_t kind, coll, type, op, root, peer; /* -1 where it has none */
  int32_t tag;                              /* a tagged send/recv's (braid.h), else -1 */
  uint64_t count, bytes;
};

/* A call's record: its entry while the entry still holds it (the ring may
 * wrap around a call that runs long: it then records nothing more). */
struct flight_mark {
  struct flight_entry* entry; /* NULL: none */
  uint64_t seq;
};

/* One connection a call uses, as flight_start takes it. */
struct flight_link_src {
  int peer;
  int dir; /* 0: receives from peer, 1: sends to it */
  struct transport_conn* conn;
};

ncclResult_t flight_init(struct flight* f);
/* The comm's place, once its bootstrap is done: its id in snapshots and dump
 * names is a keyed hash of the secret (which never leaves the rank). */
void flight_set_comm(struct flight* f, int rank, int nranks, uint64_t secret);
void flight_free(struct flight* f);

/* A call is issued (numbered in issue order: under the comm's turn lock). */
struct flight_mark flight_enqueue(struct flight* f, const struct flight_call* c);
/* It starts with `algo` (or FLIGHT_ALGO_DIRECT, -1: none) over these links. */
void flight_start(struct flight* f, struct flight_mark m, int algo,
                  const struct flight_link_src* links, int n);
/* A pass of the engine moved it: fresh counts of its links, at most once
 * a millisecond unless `now_idle` (the engine found nothing to do and is
 * about to wait: what it waits with is then exact). */
void flight_progress(struct flight* f, struct flight_mark m, int now_idle);
/* It ended with `status` (ncclSuccess: done); a second end is ignored. */
void flight_end(struct flight* f, struct flight_mark m, ncclResult_t status);
/* A failure of the comm as the log told it (the last WARN), kept with its
 * wall-clock time for the status ("rank 0 failed at 12:01:07: ..."). */
void flight_note_error(struct flight* f, ncclResult_t code, const char* what);

/* This rank's snapshot (w is zeroed and filled). */
void flight_snapshot(struct flight* f, struct flight_wire* w);

#endif /* BRAID_FLIGHT_H_ */
