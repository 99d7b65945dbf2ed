/*
 * The flight recorder (flight.c): every communicator keeps its last
 * operations, as they are enqueued, start, move and end, in memory it owns:
 * no system call per operation. What a hung job's status shows (status
 * service, braid-status), what a rank writes when it fails (BRAID_TRACE_DIR)
 * and the per-operation records (BRAID_OP_LOG) all come from here.
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

#include "nccl.h"

struct ncclComm;
struct strbuf;
struct transport_conn;
struct work_op;

#define FLIGHT_LINKS 8
#define FLIGHT_WIRE_ENTRIES 64 /* a snapshot's entries at most: every unfinished one first */
#define FLIGHT_ERROR_LEN 160
#define FLIGHT_ALGO_DIRECT (-2) /* a device collective run in one pass, no schedule */

enum flight_state { FLIGHT_QUEUED = 1, FLIGHT_RUNNING, FLIGHT_DONE, FLIGHT_FAILED };
enum flight_kind { FLIGHT_COLL = 0, FLIGHT_SEND, FLIGHT_RECV };

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
  int32_t kind, coll, type, op, algo, root, peer;
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
  int32_t kind, coll, type, op, algo, root, peer, state, status;
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

ncclResult_t flight_init(struct flight* f);
void flight_free(struct flight* f);

/* The unit's operations, as work_issue takes their turns: each gets an
 * entry (op->flight) and a number. */
void flight_enqueue(struct flight* f, struct work_op* op);
/* The operation starts: its links are the connections it will use. */
void flight_start(struct work_op* op);
/* A pass of the engine moved it: fresh counts of its links, at most once
 * a millisecond unless `now_idle` (the engine found nothing to do and is
 * about to wait: what it waits with is then exact). */
void flight_progress(struct work_op* op, int now_idle);
/* It ended with `status` (ncclSuccess: done). */
void flight_end(struct work_op* op, ncclResult_t status);
/* A failure of the comm as the log told it (the last WARN), kept with its
 * wall-clock time for the status ("rank 7 is gone (... at 12:01:07)"). */
void flight_note_error(struct flight* f, ncclResult_t code, const char* what);

/* The comm's id in snapshots and dump names: the same on every rank, a
 * keyed hash (the secret itself never leaves the rank). */
uint64_t flight_comm_id(const struct ncclComm* comm);

/* This rank's snapshot of comm (w is zeroed and filled). */
void flight_snapshot(struct ncclComm* comm, struct flight_wire* w);

/* The snapshot as JSON lines (flight_json.c): one for the rank, one per
 * entry; `why`, when not NULL, goes into the rank's line. */
void flight_json(const struct flight_wire* w, const char* why, struct strbuf* out);

/* Names for what a snapshot holds, and back (flight_names.c): a name not
 * known parses as -1 (the transport's as 255, the state's as 0, the
 * status's as ncclInternalError). */
const char* flight_op_name(int kind, int coll);
const char* flight_type_name(int type);
const char* flight_redop_name(int op);
const char* flight_algo_name(int algo);
const char* flight_transport_name(int id);
const char* flight_state_name(int state);
int flight_op_parse(const char* name, int* kind, int* coll);
int flight_type_parse(const char* name);
int flight_redop_parse(const char* name);
int flight_algo_parse(const char* name);
int flight_transport_parse(const char* name);
int flight_state_parse(const char* name);
int flight_status_parse(const char* name);
/* A CLOCK_REALTIME time in ms as ISO 8601 (UTC) into out. */
void flight_wall_time(uint64_t wall_ms, char* out, size_t cap);

/* Write the comm's snapshot to BRAID_TRACE_DIR (a file per rank and comm;
 * nothing when unset), once per comm: a timeout, a remote error, an abort. */
void flight_dump(struct ncclComm* comm, const char* why);

#endif /* BRAID_FLIGHT_H_ */
