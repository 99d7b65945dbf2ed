/*
 * Shared-memory transport: messages through a ring of slots in a segment
 * shared by the two processes (shm.h; made by shm_connect.c), with
 * head/tail credits and a futex bell; a receive may be lent where it lies
 * and a send written in place (transport.h). Large messages may be read
 * by the receiver straight from the sender's buffer instead.
 */
#include "shm.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "shm_connect.h"

/* A copy into or out of the ring spans up to this many bytes of slots that
 * are ready at once: glibc copies 1 MiB and more with its vector loop,
 * faster here than its `rep movsb` for smaller ones, while the other side
 * still gets the data in pieces it can copy in parallel. */
#define SHM_COPY_BATCH ((size_t)1 << 20)
/* A blocked connection asks the kernel whether its peer still lives at
 * most this often: a SIGKILLed peer rings no bell. */
#define SHM_ALIVE_CHECK_NS (50ull * 1000 * 1000)

/* Tell the other side that head or tail moved (or a flag changed). The
 * seq_cst bump before reading the sleeper counts pairs with the sleeper's
 * increment before its futex wait or its last look before epoll: one of
 * the two sees the other. A full pipe already holds a ring. */
void shm_bell_ring(struct shm_conn* c) {
  struct shm_header* h = c->hdr;
  atomic_fetch_add(&h->bell, 1);
  if (atomic_load(&h->sleepers) > 0)
    syscall(SYS_futex, (uint32_t*)&h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  if (c->peer_bell >= 0 && atomic_load(&h->fd_sleepers[1 - c->side]) > 0) {
    char one = 1;
    /* never EPIPE: this end reads too (shm_bell_open); EAGAIN: full, the
     * peer wakes anyway, or it died and nobody drains it */
    if (write(c->peer_bell, &one, 1) < 0) {
    }
  }
}

/* A message lends from one slot (a direct read has no slot to lend), from
 * a ring that holds the receiver's TRANSPORT_LEND_SPAN messages past the
 * oldest lent one and one more; lent slots alone never fill it. */
static size_t shm_lend_max(const struct transport_conn* base) {
  const struct shm_conn* c = (const struct shm_conn*)base;
  if (c->side != SHM_RECV || c->direct_allowed || c->nslots <= TRANSPORT_LEND_SPAN ||
      c->nlent + 1 >= c->nslots)
    return 0;
  return c->slot_bytes;
}

static const void* shm_lent(const struct transport_conn* base, uint64_t seq) {
  const struct shm_conn* c = (const struct shm_conn*)base;
  const struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  return c->data + (m->at % c->nslots) * c->slot_bytes;
}

/* Free the slots read so far, up to the first one still lent, and tell
 * the sender if that moved the tail. */
static void shm_recv_free(struct shm_conn* c) {
  uint64_t tail = c->rd;
  for (; c->lent_lo < c->cur; c->lent_lo++) {
    const struct shm_msg* m = &c->msgs[c->lent_lo % TRANSPORT_MAX_INFLIGHT];
    if (m->lend && !m->returned) {
      tail = m->at;
      break;
    }
  }
  if (tail == c->tail) return;
  c->tail = tail;
  atomic_store_explicit(&c->hdr->tail, c->tail, memory_order_release);
  shm_bell_ring(c);
}

static ncclResult_t shm_lend_return(struct transport_conn* base, uint64_t seq) {
  struct shm_conn* c = (struct shm_conn*)base;
  struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  if (seq < c->lent_lo || seq >= c->cur || !m->lend || m->returned) {
    WARN("SHM : message %" PRIu64 " from rank %d is not lent", seq, base->peer);
    return ncclInternalError;
  }
  m->returned = 1;
  c->nlent--;
  shm_recv_free(c);
  return ncclSuccess;
}

/* The receiver's tail, checked: it only moves forward, never past what
 * was produced. Anything else is the peer writing what it must not, and
 * that peer is named (a remote error, not this rank's). */
static ncclResult_t shm_tail_load(struct shm_conn* c) {
  uint64_t t = atomic_load_explicit(&c->hdr->tail, memory_order_acquire);
  if (t >= c->tail && t <= c->head) {
    c->tail = t;
    return ncclSuccess;
  }
  WARN("SHM : rank %d set its ring's tail to %" PRIu64 " where only %" PRIu64 "..%" PRIu64
       " can be: it writes the shared segment wrongly (a faulty peer)",
       c->base.peer, t, c->tail, c->head);
  return ncclRemoteError;
}

/* The sender's head, checked as the tail is: forward only, and never more
 * than a ring ahead of what this side freed. */
static ncclResult_t shm_head_load(struct shm_conn* c) {
  uint64_t h = atomic_load_explicit(&c->hdr->head, memory_order_acquire);
  if (h >= c->head && h - c->tail <= c->nslots) {
    c->head = h;
    return ncclSuccess;
  }
  WARN("SHM : rank %d set its ring's head to %" PRIu64 " where only %" PRIu64 "..%" PRIu64
       " can be: it writes the shared segment wrongly (a faulty peer)",
       c->base.peer, h, c->head, c->tail + c->nslots);
  return ncclRemoteError;
}

/* The slot the next message goes into, if it is free and nothing is
 * queued before it. A tail that fails its check gives no room; the next
 * progress reports it. */
static void* shm_send_space(struct transport_conn* base, size_t bytes) {
  struct shm_conn* c = (struct shm_conn*)base;
  if (c->side != SHM_SEND || c->cur != base->posted || bytes > c->slot_bytes) return NULL;
  if (shm_tail_load(c) != ncclSuccess || c->head - c->tail >= c->nslots) return NULL;
  c->granted = c->head + 1;
  return c->data + (c->head % c->nslots) * c->slot_bytes;
}

/* Was `b` written where send_space said the next message goes? The tail is
 * not read again: a slot once free stays free, whatever the peer writes. */
static int shm_in_place_ok(const struct shm_conn* c, const struct transport_buf* b) {
  return c->side == SHM_SEND && c->granted == c->head + 1 && c->cur == c->base.posted &&
         b->bytes <= c->slot_bytes && b->ptr == c->data + (c->head % c->nslots) * c->slot_bytes;
}

static ncclResult_t shm_post(struct transport_conn* base, const struct transport_buf* b,
                             const struct transport_tag* tag) {
  struct shm_conn* c = (struct shm_conn*)base;
  uint64_t seq = base->posted;
  if (!transport_moves(base, b)) return ncclInternalError;
  if (seq - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("SHM : too many messages in flight %s rank %d", c->side == SHM_SEND ? "to" : "from",
         base->peer);
    return ncclInternalError;
  }
  if (c->side == SHM_SEND &&
      atomic_load_explicit(&c->hdr->closed[SHM_RECV], memory_order_acquire)) {
    WARN("SHM : rank %d closed its receiving connection (it failed or aborted)", base->peer);
    return ncclRemoteError;
  }
  if (c->side == SHM_RECV && seq - c->lent_lo >= TRANSPORT_MAX_INFLIGHT) {
    WARN("SHM : too many messages from rank %d in flight while message %" PRIu64 " is lent",
         base->peer, c->lent_lo);
    return ncclInternalError;
  }
  size_t lend_max = b->lend ? shm_lend_max(base) : 0;
  if (b->lend && (lend_max == 0 || b->bytes > lend_max)) {
    WARN("SHM : cannot lend a %zu-byte message from rank %d", b->bytes, base->peer);
    return ncclInternalError;
  }
  if (b->in_place && !shm_in_place_ok(c, b)) {
    WARN("SHM : a %zu-byte message to rank %d is not in the slot it goes into", b->bytes,
         base->peer);
    return ncclInternalError;
  }
  struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  m->buf = b->ptr;
  m->in_place = b->in_place;
  m->bytes = b->bytes;
  m->direct = 0;
  m->ack = 0;
  m->lend = b->lend;
  m->returned = 0;
  m->at = 0;
  c->nlent += (uint32_t)b->lend;
  if (tag)
    m->tag = *tag;
  else
    memset(&m->tag, 0, sizeof(m->tag));
  base->posted++;
  return ncclSuccess;
}

/* Read directly only once the receiver has attached and said it can. */
static int shm_send_direct_ok(struct shm_conn* c, size_t bytes) {
  if (c->direct_min == 0 || bytes < c->direct_min) return 0;
  if (c->direct < 0 && atomic_load_explicit(&c->hdr->attached, memory_order_acquire))
    c->direct = (int)atomic_load_explicit(&c->hdr->direct_ok, memory_order_relaxed);
  return c->direct > 0;
}

/* A copied message is done once in the slots, a direct one once the
 * receiver has released its slot: that release is the acknowledgement. */
static void shm_send_complete(struct shm_conn* c, int* moved) {
  struct transport_conn* b = &c->base;
  while (b->completed < c->cur) {
    const struct shm_msg* m = &c->msgs[b->completed % TRANSPORT_MAX_INFLIGHT];
    if (m->direct && c->tail < m->ack) break; /* the receiver still reads from it */
    b->completed++;
    *moved = 1;
  }
}

/* How many slots one copy may fill or empty at once. */
static uint32_t shm_copy_span(const struct shm_conn* c, uint64_t avail, uint64_t idx, size_t left) {
  uint64_t k = MIN(avail, c->nslots - idx);        /* up to the end of the ring */
  k = MIN(k, MAX(DIV_UP(left, c->slot_bytes), 1)); /* and of the message */
  return (uint32_t)MAX(MIN(k, MAX(SHM_COPY_BATCH / c->slot_bytes, 1)), 1);
}

/* One move of the sending side: complete what is done, then fill slots. */
static ncclResult_t shm_send_step(struct shm_conn* c, int* moved) {
  ncclResult_t res = ncclSuccess;
  struct shm_header* h = c->hdr;
  CHECK(shm_tail_load(c));
  shm_send_complete(c, moved);
  uint64_t nfree = c->nslots - (c->head - c->tail);
  if (c->cur == c->base.posted || nfree == 0) return ncclSuccess;

  struct shm_msg* m = &c->msgs[c->cur % TRANSPORT_MAX_INFLIGHT];
  uint64_t idx = c->head % c->nslots;
  uint32_t k = 1;
  if (c->cur_off == 0) m->direct = !m->in_place && shm_send_direct_ok(c, m->bytes);
  if (m->in_place) { /* the writer filled slot idx (shm_send_space) */
    c->slots[idx] =
        (struct shm_slot){SHM_SLOT_COPY, (uint32_t)m->bytes, m->bytes, c->cur, 0, m->tag};
    c->cur_off = m->bytes;
  } else if (m->direct) {
    c->slots[idx] =
        (struct shm_slot){SHM_SLOT_DIRECT, 0, m->bytes, c->cur, (uintptr_t)m->buf, m->tag};
    m->ack = c->head + 1;
    c->cur_off = m->bytes;
  } else {
    size_t left = m->bytes - c->cur_off;
    k = shm_copy_span(c, nfree, idx, left);
    size_t n = MIN(left, (size_t)k * c->slot_bytes);
    /* host memory only (caps): a plain copy, no query of the pointers */
    memcpy(c->data + idx * c->slot_bytes, m->buf + c->cur_off, n);
    for (uint32_t j = 0; j < k; j++) { /* a 0-byte message still takes its one slot */
      size_t piece = MIN(c->slot_bytes, n - j * c->slot_bytes);
      c->slots[idx + j] =
          (struct shm_slot){SHM_SLOT_COPY, (uint32_t)piece, m->bytes, c->cur, 0, m->tag};
    }
    c->cur_off += n;
  }
  if (c->cur_off >= m->bytes) {
    c->cur++;
    c->cur_off = 0;
  }
  c->head += k;
  c->granted = 0;
  atomic_store_explicit(&h->head, c->head, memory_order_release);
  shm_bell_ring(c);
  *moved += (int)k;
  shm_send_complete(c, moved);
fail:
  return res;
}

/* Has the peer shut down, closed, or died? Unless forced, its death is
 * asked of the kernel at most every SHM_ALIVE_CHECK_NS. */
static int shm_peer_gone(struct shm_conn* c, int* dead, int force) {
  *dead = 0;
  if (atomic_load_explicit(&c->hdr->closed[!c->side], memory_order_acquire)) return 1;
  uint64_t now = braid_now_ns();
  if (!force && now < c->alive_ns) return 0;
  c->alive_ns = now + SHM_ALIVE_CHECK_NS;
  *dead = !shm_pid_alive(c->peer_pid);
  return *dead;
}

static ncclResult_t shm_recv_direct(struct shm_conn* c, struct shm_msg* m,
                                    const struct shm_slot* s) {
  size_t piece = MIN(SHM_COPY_BATCH, m->bytes - c->cur_off);
  struct iovec local = {m->buf + c->cur_off, piece};
  struct iovec remote = {(void*)(uintptr_t)(s->addr + c->cur_off), piece};
  ssize_t n = process_vm_readv(c->peer_pid, &local, 1, &remote, 1, 0);
  if (n > 0) {
    c->cur_off += (size_t)n;
    return ncclSuccess;
  }
  int err = n < 0 ? errno : EFAULT, dead = 0;
  /* A peer that failed may have freed the buffer before we read it. */
  if (err == ESRCH || shm_peer_gone(c, &dead, 1)) {
    WARN("SHM : peer rank %d (pid %d) exited or closed while its message was read", c->base.peer,
         (int)c->peer_pid);
    return ncclRemoteError;
  }
  WARN("SHM : reading %zu bytes of message %" PRIu64 " from rank %d failed: %s", piece, s->seq,
       c->base.peer, strerror(err));
  return ncclSystemError;
}

/* Does slot `idx` hold the piece of message `seq` at `off` as posted here? */
static int shm_slot_matches(const struct shm_conn* c, uint64_t idx, const struct shm_msg* m,
                            uint64_t seq, size_t off) {
  const struct shm_slot* s = &c->slots[idx];
  return s->kind == SHM_SLOT_COPY && s->seq == seq && s->msg_bytes == m->bytes &&
         s->bytes == MIN(c->slot_bytes, m->bytes - off);
}

/* One move of the receiving side: empty slots, or read directly. */
static ncclResult_t shm_recv_step(struct shm_conn* c, int* moved) {
  struct transport_conn* b = &c->base;
  if (c->cur == b->posted) return ncclSuccess;
  if (c->rd == c->head) {
    ncclResult_t res = shm_head_load(c);
    if (res != ncclSuccess) return res;
  }
  if (c->rd == c->head) return ncclSuccess;

  struct shm_msg* m = &c->msgs[c->cur % TRANSPORT_MAX_INFLIGHT];
  uint64_t idx = c->rd % c->nslots;
  const struct shm_slot* s = &c->slots[idx];
  uint32_t k = 1;
  ncclResult_t res =
      transport_check_message(b, s->seq, s->msg_bytes, &s->tag, c->cur, m->bytes, &m->tag);
  if (res != ncclSuccess) return res;
  if (s->kind == SHM_SLOT_DIRECT && !c->direct_allowed) {
    WARN("SHM : rank %d sent a direct read, which this rank did not allow", b->peer);
    return ncclRemoteError;
  } else if (s->kind == SHM_SLOT_DIRECT) {
    if (c->cur_off < m->bytes && (res = shm_recv_direct(c, m, s)) != ncclSuccess) return res;
    *moved = 1;
    if (c->cur_off < m->bytes) return ncclSuccess; /* the slot stays ours until the last byte */
  } else if (m->lend) { /* at most one slot (shm_lend_max): whole once its slot is in */
    if (!shm_slot_matches(c, idx, m, c->cur, 0)) {
      WARN("SHM : bad slot from rank %d (kind %u, %u bytes) for a lent %zu-byte message", b->peer,
           s->kind, s->bytes, m->bytes);
      return ncclRemoteError;
    }
    m->at = c->rd;
    c->cur_off = m->bytes;
  } else if (shm_slot_matches(c, idx, m, c->cur, c->cur_off)) {
    /* each slot's size as this side reckons it (the match said the slot
     * agrees): never a second read of what the sender may have changed */
    uint32_t span = shm_copy_span(c, c->head - c->rd, idx, m->bytes - c->cur_off);
    size_t n = MIN(c->slot_bytes, m->bytes - c->cur_off);
    for (; k < span && shm_slot_matches(c, idx + k, m, c->cur, c->cur_off + n); k++)
      n += MIN(c->slot_bytes, m->bytes - c->cur_off - n);
    memcpy(m->buf + c->cur_off, c->data + idx * c->slot_bytes, n); /* host memory: as above */
    c->cur_off += n;
  } else {
    WARN("SHM : bad slot from rank %d (kind %u, %u bytes at offset %zu of a %zu-byte message)",
         b->peer, s->kind, s->bytes, c->cur_off, m->bytes);
    return ncclRemoteError;
  }
  c->rd += k;
  *moved += (int)k;
  if (c->cur_off >= m->bytes) {
    c->cur++;
    c->cur_off = 0;
    b->completed++;
  }
  shm_recv_free(c);
  return ncclSuccess;
}

/* Blocked: sleep on the bell, or nap where the peer was caught lowering
 * our sleeper counts (transport.h): it would skip our wake-ups. */
static void shm_wait(struct shm_conn* c, uint32_t seen) {
  if (atomic_load_explicit(&c->miscounted, memory_order_relaxed)) {
    if (!c->miscount_told)
      WARN(
          "SHM : a sleeper count in the segment shared with rank %d fell below this rank's own "
          "(written by someone else: a faulty peer?): this connection polls from now on",
          c->base.peer);
    c->miscount_told = 1;
    transport_wait_nap(c->waits);
    return;
  }
  transport_wait_on_futex(
      c->waits, &c->hdr->bell, &c->hdr->sleepers,
      atomic_load(&c->hdr->fd_ringable[c->side]) ? &c->hdr->fd_sleepers[c->side] : NULL,
      &c->miscounted, seen);
}

static ncclResult_t shm_progress(struct transport_conn* base, int* progressed) {
  struct shm_conn* c = (struct shm_conn*)base;
  ncclResult_t res = ncclSuccess;
  uint32_t budget = c->nslots; /* slots moved per call at most: other connections wait */
  uint32_t seen = 0;
  int armed = 0, gone = 0, dead = 0, moved_any = 0;
  if (c->shut) return ncclRemoteError; /* whoever shut it down has said why */
  for (;;) {
    int moved = 0;
    if (c->side == SHM_SEND)
      CHECK(shm_send_step(c, &moved));
    else
      CHECK(shm_recv_step(c, &moved));
    if (moved) {
      *progressed = moved_any = 1;
      armed = gone = 0;
      if ((uint32_t)moved >= budget) return ncclSuccess;
      budget -= (uint32_t)moved;
      continue;
    }
    if (base->completed == base->posted) return ncclSuccess; /* idle, not blocked */
    /* Blocked. Read the bell and look once more: a move after this read
     * changes the bell, so a sleep on `seen` cannot miss it. */
    if (!armed) {
      seen = atomic_load(&c->hdr->bell);
      armed = 1;
      continue;
    }
    if (gone) {
      if (dead)
        WARN("SHM : peer rank %d (pid %d) exited", base->peer, (int)c->peer_pid);
      else
        WARN("SHM : rank %d closed its %s connection (it failed or aborted)", base->peer,
             c->side == SHM_SEND ? "receiving" : "sending");
      return ncclRemoteError;
    }
    /* What moved in this call is reported first; the next call fails. Its
     * last moves came before it went: look once more before failing. */
    if (!moved_any && shm_peer_gone(c, &dead, 0)) {
      gone = 1;
      continue;
    }
    shm_wait(c, seen);
    return ncclSuccess;
  }
fail:
  return res;
}

/* The peer sees the flag at its next blocked look, woken by the bell. */
static void shm_shutdown(struct transport_conn* base) {
  struct shm_conn* c = (struct shm_conn*)base;
  struct shm_header* hdr = __atomic_load_n(&c->hdr, __ATOMIC_ACQUIRE);
  atomic_store(&c->shut, 1);
  if (hdr == NULL) return;
  atomic_store_explicit(&hdr->closed[c->side], 1, memory_order_release);
  shm_bell_ring(c);
}

/* A send is complete once its bytes are in the slots, and the process may
 * destroy its comm and exit right after: a graceful close (no shutdown
 * came first) waits until the receiver has taken every slot, or closed, or
 * died, so nothing sent is lost with the segment. Bounded by the timeout. */
static void shm_send_drain(struct shm_conn* c) {
  uint64_t deadline = braid_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
  int dead;
  if (c->side != SHM_SEND || c->shut || c->hdr == NULL) return;
  while (atomic_load_explicit(&c->hdr->tail, memory_order_acquire) < c->head) {
    if (shm_peer_gone(c, &dead, 1)) return;
    if (braid_now_ns() >= deadline) {
      WARN("SHM : closing with %" PRIu64 " slots rank %d never took (BRAID_TIMEOUT_MS=%lld)",
           c->head - atomic_load(&c->hdr->tail), c->base.peer, (long long)c->timeout_ms);
      return;
    }
    usleep(SHM_POLL_MAX_US);
  }
}

void shm_close(struct transport_conn* base) {
  struct shm_conn* c = (struct shm_conn*)base;
  shm_send_drain(c);
  if (c->hdr) {
    atomic_store_explicit(&c->hdr->closed[c->side], 1, memory_order_release);
    shm_bell_ring(c);
    munmap(c->hdr, c->map_bytes);
  }
  if (c->peer_bell >= 0) close(c->peer_bell);
  /* The receiver unlinks when it attaches; this covers one that never did. */
  if (c->named && shm_unlink(c->name) != 0 && errno != ENOENT)
    WARN("SHM : shm_unlink(%s) failed: %s", c->name, strerror(errno));
  free(c);
}

const struct transport shm_transport = {
    .name = "SHM",
    .key = "shm",
    .id = 1,
    .link = TRANSPORT_LINK_MEMORY,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_WAKE_FUTEX,
    .can_connect = shm_can_connect,
    .blob_bytes = sizeof(struct shm_blob),
    .blob_make = shm_blob_make,
    .connect_send = shm_connect_send,
    .connect_recv = shm_connect_recv,
    .connect_recv_try = shm_connect_recv_try,
    .post = shm_post,
    .lend_max = shm_lend_max,
    .send_space = shm_send_space,
    .lent = shm_lent,
    .lend_return = shm_lend_return,
    .progress = shm_progress,
    .shutdown = shm_shutdown,
    .close = shm_close,
};
