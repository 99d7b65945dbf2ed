/*
 * What every transport shares: its blob in a peer table (a record of its
 * id, length and bytes), the check that a received message is the one its
 * receive was posted for, reported the same way everywhere, that a posted
 * buffer is memory the transport moves, and registering a user range with
 * the transports that pin or map memory.
 */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "core.h"
#include "transport.h"

static const struct transport_tag kNoTag;

/* ---- blobs: records of (id, length, bytes) in peer_info.blobs ---- */

/* A record: its id, its length, 6 zero bytes, then its bytes, padded to 8:
 * every blob starts 8-aligned, as the structs transports read them into
 * need. */
#define BLOB_HEADER 8
#define BLOB_ROUND(n) (((n) + 7u) & ~(size_t)7u)
_Static_assert(offsetof(struct peer_info, blobs) % 8 == 0, "blobs start 8-aligned");

/* The offset of t's record in `blobs`, or of the end of the records (*found 0). */
static size_t blob_find(const uint8_t* b, const struct transport* t, int* found) {
  size_t at = 0;
  *found = 0;
  /* a peer's bytes: every length is checked against what is left */
  while (at + BLOB_HEADER <= PEER_BLOB_BYTES && b[at + 1] != 0) {
    size_t len = b[at + 1];
    if (at + BLOB_HEADER + BLOB_ROUND(len) > PEER_BLOB_BYTES)
      return PEER_BLOB_BYTES; /* malformed */
    if (b[at] == t->id) {
      *found = len == t->blob_bytes;
      return *found ? at : PEER_BLOB_BYTES;
    }
    at += BLOB_HEADER + BLOB_ROUND(len);
  }
  return at;
}

void* transport_blob_put(struct peer_info* p, const struct transport* t) {
  int found;
  size_t at = blob_find(p->blobs, t, &found);
  if (found) return p->blobs + at + BLOB_HEADER;
  if (t->blob_bytes == 0 || t->blob_bytes > 255 ||
      at + BLOB_HEADER + BLOB_ROUND(t->blob_bytes) > PEER_BLOB_BYTES)
    return NULL;
  p->blobs[at] = (uint8_t)t->id;
  p->blobs[at + 1] = (uint8_t)t->blob_bytes;
  return p->blobs + at + BLOB_HEADER;
}

/* Zeros for a blob a rank did not publish: every transport reads an
 * all-zero blob as "not here" (no listener, no segment, no port). */
static const uint64_t k_no_blob[PEER_BLOB_BYTES / 8]; /* 8-aligned, as a record's bytes */

const void* transport_peer_blob(const struct transport_ctx* ctx, const struct transport* t,
                                int rank) {
  int found;
  size_t at = blob_find(ctx->peers[rank].blobs, t, &found);
  return found ? (const void*)(ctx->peers[rank].blobs + at + BLOB_HEADER) : (const void*)k_no_blob;
}

ncclResult_t transport_check_message(struct transport_conn* conn, uint64_t seq, uint64_t bytes,
                                     const struct transport_tag* tag, uint64_t want_seq,
                                     uint64_t want_bytes, const struct transport_tag* want_tag) {
  if (tag == NULL) tag = &kNoTag;
  if (want_tag == NULL) want_tag = &kNoTag;
  if (seq == want_seq && bytes == want_bytes && memcmp(tag, want_tag, sizeof(*tag)) == 0)
    return ncclSuccess;
  conn->peer_tag = *tag;
  if (seq != want_seq || memcmp(tag, want_tag, sizeof(*tag)) != 0) {
    conn->mismatch = TRANSPORT_OTHER_CALL;
    WARN("%s : rank %d sent message %" PRIu64
         " of another call where this rank posted message %" PRIu64
         ": the ranks' calls on this communicator differ",
         conn->ops->name, conn->peer, seq, want_seq);
  } else {
    conn->mismatch = TRANSPORT_OTHER_SIZE;
    WARN("%s : Message truncated : rank %d sent %" PRIu64 " bytes where this rank posted %" PRIu64
         " (a send and its receive differ in size)",
         conn->ops->name, conn->peer, bytes, want_bytes);
  }
  return ncclInvalidUsage;
}

int transport_moves(const struct transport_conn* conn, const struct transport_buf* b) {
  const unsigned kinds = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_DEVICE_MEM;
  if (b->mem != 0 && (b->mem & ~kinds) == 0 && (b->mem & ~conn->ops->caps) == 0) return 1;
  WARN("%s : posted memory of kind %#x to rank %d; it moves %#x", conn->ops->name, b->mem,
       conn->peer, conn->ops->caps & kinds);
  return 0;
}

ncclResult_t transport_register_each(const struct transport* const* list, size_t n,
                                     struct transport_ctx* ctx, void* base, size_t size,
                                     void** handles) {
  ncclResult_t res = ncclSuccess;
  size_t i = 0;
  for (; i < n; i++) {
    if (list[i]->reg == NULL) continue;
    res = list[i]->reg(ctx, base, size, &handles[list[i]->id]);
    if (res != ncclSuccess) break;
  }
  if (res == ncclSuccess) return res;
  WARN("%s : cannot register %zu bytes at %p", list[i]->name, size, base);
  transport_deregister_each(list, i, ctx, handles);
  return res;
}

void transport_deregister_each(const struct transport* const* list, size_t n,
                               struct transport_ctx* ctx, void** handles) {
  for (size_t i = 0; i < n; i++) {
    if (list[i]->dereg == NULL || handles[list[i]->id] == NULL) continue;
    list[i]->dereg(ctx, handles[list[i]->id]);
    handles[list[i]->id] = NULL;
  }
}
