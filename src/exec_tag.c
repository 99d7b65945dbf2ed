/*
 * The call every collective message carries (transport_tag): what all
 * ranks must have called, as this rank planned it. A receiver whose call
 * differs from its peer's sees it on the first message from that peer,
 * and reports both calls.
 */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "core.h"
#include "executor.h"
#include "kernels.h"

#define EXEC_TAG_MAGIC 0xb7a1u /* nonzero: a collective; p2p messages carry no tag */

struct exec_tag {
  uint8_t coll, type, op, algo; /* op: kern_op | 0x10 premultiplied | 0x20 post-divided */
  int32_t root;
  uint64_t count;
  uint32_t chunk_bytes;
  uint16_t slices_per_step;
  uint16_t magic;
};
_Static_assert(sizeof(struct exec_tag) == TRANSPORT_TAG_BYTES, "a call is one transport tag");

void exec_tag_make(const struct ncclComm* comm, const struct exec_args* a,
                   struct transport_tag* out) {
  struct sched_key key;
  struct exec_tag t;
  exec_key(comm, a, &key);
  memset(&t, 0, sizeof(t));
  t.coll = (uint8_t)a->coll;
  t.type = (uint8_t)a->type;
  t.op = (uint8_t)(a->redop.op | (a->pre ? 0x10 : 0) | (a->post ? 0x20 : 0));
  t.algo = (uint8_t)a->algo;
  t.root = a->root;
  t.count = a->count;
  t.chunk_bytes = (uint32_t)key.chunk_bytes;
  t.slices_per_step = (uint16_t)key.slices_per_step;
  t.magic = EXEC_TAG_MAGIC;
  memcpy(out->b, &t, sizeof(t));
}

static void exec_tag_describe(const struct transport_tag* tag, char* buf, size_t len) {
  static const char* const ops[] = {"sum", "prod", "max", "min"};
  struct exec_tag t;
  memcpy(&t, tag->b, sizeof(t));
  if (t.magic != EXEC_TAG_MAGIC) {
    snprintf(buf, len, "a send/recv or no call");
    return;
  }
  snprintf(buf, len, "%s count %llu type %d op %s%s%s root %d (%s, chunk %u, %u slices)",
           sched_coll_name(t.coll), (unsigned long long)t.count, t.type, ops[t.op & 3],
           t.op & 0x10 ? " premultiplied" : "", t.op & 0x20 ? " averaged" : "", t.root,
           sched_algo_name(t.algo), t.chunk_bytes, t.slices_per_step);
}

void exec_tag_warn(const struct ncclComm* comm, const struct transport_tag* mine, int peer,
                   const struct transport_tag* theirs) {
  char here[192], there[192];
  exec_tag_describe(mine, here, sizeof(here));
  exec_tag_describe(theirs, there, sizeof(there));
  WARN(
      "Rank %d called %s; rank %d called %s: every rank must make the same collective calls "
      "on a communicator, in the same order, with the same environment",
      comm->rank, here, peer, there);
}

void exec_tag_report(const struct ncclComm* comm, const struct transport_tag* mine) {
  for (int p = 0; p < comm->nranks; p++) {
    const struct transport_conn* c = comm->recv_conns[p];
    if (c == NULL || c->mismatch == TRANSPORT_MATCH) continue;
    exec_tag_warn(comm, mine, p, &c->peer_tag);
    return;
  }
}
