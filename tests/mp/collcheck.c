/* Multi-process tests: buffers, inputs and exact references for every
 * collective. Reductions reuse archeck's tables; copies use hashed bytes. */
#include "collcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#define CC_GUARD 64 /* guard bytes before and after every allocation */
#define CC_GUARD_BYTE 0x5A
#define CC_POISON 0xA5
#define CC_MAX_REPORTS 4
#define CC_SHM_HASH 512 /* env->shm ints used by cc_same_everywhere */
#define CC_SHM_ID 800   /* env->shm ints used by cc_share_id */
#define CC_ID_INTS (1 + (int)(sizeof(ncclUniqueId) / sizeof(int)))

static const char* const kCollNames[CC_NCOLLS] = {"allreduce", "broadcast", "bcast",
                                                  "reduce",    "allgather", "reducescatter",
                                                  "alltoall",  "gather",    "scatter"};

const char* cc_coll_name(int coll) {
  return coll >= 0 && coll < CC_NCOLLS ? kCollNames[coll] : "?";
}

int cc_is_reduction(int coll) {
  return coll == CC_ALLREDUCE || coll == CC_REDUCE || coll == CC_REDUCESCATTER;
}

int cc_has_root(int coll) {
  return coll == CC_BROADCAST || coll == CC_BCAST || coll == CC_REDUCE || coll == CC_GATHER ||
         coll == CC_SCATTER;
}

static int is_inplace(const cc_call* c) {
  return (c->inplace && c->coll != CC_ALLTOALL) || c->coll == CC_BCAST;
}

void cc_describe(const cc_call* c, char* buf, size_t n) {
  char op[32] = "", root[24] = "";
  if (cc_is_reduction(c->coll)) snprintf(op, sizeof(op), " op=%s", ar_kind_name(c->kind));
  if (cc_has_root(c->coll)) snprintf(root, sizeof(root), " root=%d", c->root);
  snprintf(buf, n, "%s type=%s%s count=%zu%s %s nranks=%d", cc_coll_name(c->coll),
           mp_type(c->type) ? mp_type(c->type)->name : "?", op, c->count, root,
           is_inplace(c) ? "in-place" : "out-of-place", c->nranks);
}

void cc_report_rc(const cc_call* c, const mp_env* env, ncclComm_t comm, ncclResult_t rc) {
  char d[160];
  cc_describe(c, d, sizeof(d));
  mp_fail(env, "%s returned %d (%s): \"%s\"", d, (int)rc, ncclGetErrorString(rc),
          ncclGetLastError(comm) ? ncclGetLastError(comm) : "(null)");
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t call_seed(const cc_call* c) {
  return mix64(((uint64_t)c->coll << 56) ^ ((uint64_t)c->type << 48) ^ ((uint64_t)c->nranks << 40) ^
               ((uint64_t)(c->root + 1) << 32) ^ c->count ^ mix64(c->salt));
}

/* Hashed bytes of rank `who`'s copy-collective input, elements [first, +len). */
#define PATTERN_LOOP(T)                                                      \
  for (size_t i = 0; i < len; i++) {                                         \
    T v = (T)mix64(s + first + i);                                           \
    memcpy(out + i * sizeof(T), &v, sizeof(T)); /* a store: size is fixed */ \
  }

/* Hashed bytes of rank `who`'s copy-collective input, elements [first, +len):
 * the low bytes of each element's hash, stored with the element's own width
 * (a memcpy of a variable width is a libc call per element). */
static void pattern(const cc_call* c, int who, size_t first, size_t len, unsigned char* out) {
  uint64_t s = mix64(call_seed(c) ^ (0x5bd1e995ull * (uint64_t)(who + 1)));
  switch (mp_type(c->type)->size) {
    case 1:
      PATTERN_LOOP(uint8_t)
      break;
    case 2:
      PATTERN_LOOP(uint16_t)
      break;
    case 4:
      PATTERN_LOOP(uint32_t)
      break;
    default:
      PATTERN_LOOP(uint64_t)
      break;
  }
}

static unsigned char* guarded_alloc(size_t bytes) {
  unsigned char* p = malloc(bytes + 2 * CC_GUARD);
  if (!p) return NULL;
  memset(p, CC_GUARD_BYTE, CC_GUARD);
  memset(p + CC_GUARD + bytes, CC_GUARD_BYTE, CC_GUARD);
  return p + CC_GUARD;
}

static void guarded_free(unsigned char* p) {
  if (p) free(p - CC_GUARD);
}

static size_t esize(const cc_call* c) {
  return mp_type(c->type)->size;
}

/* Input elements of this rank: the count of the reduced vector (reductions)
 * or of its own send block. */
static size_t input_elems(const cc_call* c) {
  int whole = c->coll == CC_REDUCESCATTER || c->coll == CC_ALLTOALL || c->coll == CC_SCATTER;
  return whole ? (size_t)c->nranks * c->count : c->count;
}

static void fill_input(const cc_call* c, unsigned char* out) {
  if (cc_is_reduction(c->coll)) {
    ar_expect_fill(&c->ref, 0, 0, input_elems(c), out);
    return;
  }
  if (c->coll == CC_SCATTER && c->rank != c->root) { /* its sendbuff is not read */
    memset(out, CC_POISON, input_elems(c) * esize(c));
    return;
  }
  int who = c->rank;
  if (c->coll == CC_BROADCAST || c->coll == CC_BCAST)
    who = c->rank == c->root ? c->root : -1 - c->rank;
  pattern(c, who, 0, input_elems(c), out);
}

static int layout(cc_call* c) {
  size_t n = (size_t)c->nranks, e = esize(c), cnt = c->count;
  size_t send = cnt, recv = cnt;
  if (c->coll == CC_ALLGATHER || c->coll == CC_GATHER) recv = n * cnt;
  if (c->coll == CC_REDUCESCATTER || c->coll == CC_SCATTER) send = n * cnt;
  if (c->coll == CC_ALLTOALL) send = recv = n * cnt;
  if (is_inplace(c)) {
    c->relems = send > recv ? send : recv;
    c->selems = 0;
    c->rbase = guarded_alloc(c->relems * e);
    c->sbase = NULL;
    if (!c->rbase) return -1;
    c->send = c->recv = c->rbase;
    if (c->coll == CC_ALLGATHER) c->send = c->rbase + (size_t)c->rank * cnt * e;
    if (c->coll == CC_REDUCESCATTER) c->recv = c->rbase + (size_t)c->rank * cnt * e;
    /* in place on root: its own block already where the result puts it */
    if (c->coll == CC_GATHER) c->send = c->rbase + (size_t)c->rank * cnt * e;
    if (c->coll == CC_SCATTER) c->recv = c->rbase + (size_t)c->rank * cnt * e;
    return 0;
  }
  c->selems = send;
  c->relems = recv;
  c->sbase = guarded_alloc(send * e);
  c->rbase = guarded_alloc(recv * e);
  c->send = c->sbase;
  c->recv = c->rbase;
  return c->sbase && c->rbase ? 0 : -1;
}

int cc_prepare(cc_call* c, const mp_env* env) {
  c->rank = env->rank;
  c->nranks = env->nranks;
  c->sbase = c->rbase = NULL;
  memset(&c->ref, 0, sizeof(c->ref));
  if (!mp_type(c->type)) {
    mp_fail(env, "cc_prepare: bad type %d", (int)c->type);
    return -1;
  }
  if (cc_is_reduction(c->coll)) {
    c->ref.type = c->type;
    c->ref.kind = c->kind;
    c->ref.count = input_elems(c);
    c->ref.salt = c->salt ^ ((uint64_t)c->coll << 20) ^ ((uint64_t)(c->root + 1) << 28);
    c->ref.op = c->op;
    if (ar_tables_init(&c->ref, env) != 0) return -1;
  }
  if (layout(c) != 0) {
    mp_fail(env, "out of memory for buffers of %zu + %zu elements", c->selems, c->relems);
    cc_release(c);
    return -1;
  }
  size_t e = esize(c);
  memset(c->rbase, CC_POISON, c->relems * e);
  if (c->sbase) memset(c->sbase, CC_POISON, c->selems * e);
  int bcast_nonroot = (c->coll == CC_BROADCAST || c->coll == CC_BCAST) && c->rank != c->root;
  if (!(bcast_nonroot && is_inplace(c))) fill_input(c, c->send);
  return 0;
}

void cc_release(cc_call* c) {
  guarded_free(c->sbase);
  guarded_free(c->rbase);
  c->sbase = c->rbase = NULL;
  c->send = c->recv = NULL;
  ar_release(&c->ref);
}

/* Compares len elements of got with want; prints the first mismatches with
 * index base+i. Returns the number of mismatches. */
static size_t compare(const cc_call* c, const mp_env* env, const unsigned char* got,
                      const unsigned char* want, size_t len, size_t base, const char* what) {
  size_t e = esize(c);
  if (len == 0 || memcmp(got, want, len * e) == 0) return 0;
  size_t bad = 0;
  char d[160];
  cc_describe(c, d, sizeof(d));
  for (size_t i = 0; i < len; i++) {
    if (memcmp(got + i * e, want + i * e, e) == 0) continue;
    if (bad < CC_MAX_REPORTS) {
      char w[64], g[64];
      mp_format(c->type, want + i * e, w, sizeof(w));
      mp_format(c->type, got + i * e, g, sizeof(g));
      mp_fail(env, "%s: %s[%zu] expected %s got %s", d, what, base + i, w, g);
    }
    bad++;
  }
  mp_fail(env, "%s: %zu of %zu elements of %s wrong", d, bad, len, what);
  return bad;
}

static int check_guards(const cc_call* c, const mp_env* env, const unsigned char* p, size_t elems,
                        const char* what) {
  const unsigned char* g[2] = {p - CC_GUARD, p + elems * esize(c)};
  for (int s = 0; s < 2; s++) {
    for (size_t k = 0; k < CC_GUARD; k++) {
      if (g[s][k] == CC_GUARD_BYTE) continue;
      char d[160];
      cc_describe(c, d, sizeof(d));
      mp_fail(env, "%s: %s written %s its bounds (guard byte %zu is 0x%02x)", d, what,
              s ? "after" : "before", k, g[s][k]);
      return 1;
    }
  }
  return 0;
}

/* want = what recv (or the in-place buffer) must hold after the call. */
static void expected_recv(const cc_call* c, unsigned char* want) {
  size_t e = esize(c), n = (size_t)c->nranks;
  switch (c->coll) {
    case CC_ALLREDUCE:
      ar_expect_fill(&c->ref, 1, 0, c->count, want);
      break;
    case CC_REDUCE:
      if (c->rank == c->root)
        ar_expect_fill(&c->ref, 1, 0, c->count, want);
      else if (is_inplace(c))
        ar_expect_fill(&c->ref, 0, 0, c->count, want); /* the input, unchanged */
      else
        memset(want, CC_POISON, c->count * e); /* never written */
      break;
    case CC_BROADCAST:
    case CC_BCAST:
      pattern(c, c->root, 0, c->count, want);
      break;
    case CC_ALLGATHER:
      for (size_t r = 0; r < n; r++) pattern(c, (int)r, 0, c->count, want + r * c->count * e);
      break;
    case CC_ALLTOALL: /* block r: rank r's block for this rank */
      for (size_t r = 0; r < n; r++)
        pattern(c, (int)r, (size_t)c->rank * c->count, c->count, want + r * c->count * e);
      break;
    case CC_GATHER:
      if (c->rank == c->root) {
        for (size_t r = 0; r < n; r++) pattern(c, (int)r, 0, c->count, want + r * c->count * e);
      } else {
        memset(want, CC_POISON, n * c->count * e); /* never written */
        if (is_inplace(c)) pattern(c, c->rank, 0, c->count, want + (size_t)c->rank * c->count * e);
      }
      break;
    case CC_SCATTER:
      if (is_inplace(c)) {
        fill_input(c, want); /* root: its input, unchanged; others: untouched */
        pattern(c, c->root, (size_t)c->rank * c->count, c->count,
                want + (size_t)c->rank * c->count * e);
      } else {
        pattern(c, c->root, (size_t)c->rank * c->count, c->count, want);
      }
      break;
    case CC_REDUCESCATTER:
      if (is_inplace(c)) {
        ar_expect_fill(&c->ref, 0, 0, n * c->count, want); /* other blocks: the input */
        ar_expect_fill(&c->ref, 1, (size_t)c->rank * c->count, c->count,
                       want + (size_t)c->rank * c->count * e);
      } else {
        ar_expect_fill(&c->ref, 1, (size_t)c->rank * c->count, c->count, want);
      }
      break;
  }
}

static const char* recv_name(const cc_call* c) {
  if ((c->coll == CC_REDUCE || c->coll == CC_GATHER) && c->rank != c->root)
    return is_inplace(c) ? "buffer of a non-root (must stay unchanged)"
                         : "recvbuff of a non-root (must not be written)";
  if (is_inplace(c) && c->coll == CC_REDUCESCATTER)
    return "in-place sendbuff (block rank*count = result)";
  return is_inplace(c) ? "buffer" : "recvbuff";
}

/* The guards of both buffers: what a failed call must leave alone. */
static int guards_changed(const cc_call* c, const mp_env* env) {
  int bad = check_guards(c, env, c->rbase, c->relems, is_inplace(c) ? "buffer" : "recvbuff");
  if (c->sbase) bad += check_guards(c, env, c->sbase, c->selems, "sendbuff");
  return bad;
}

int cc_verify_guards(const cc_call* c, const mp_env* env) {
  return guards_changed(c, env) ? 1 : 0;
}

int cc_verify(const cc_call* c, const mp_env* env) {
  size_t e = esize(c);
  size_t big = c->relems > c->selems ? c->relems : c->selems;
  unsigned char* want = malloc(big * e + 1);
  if (!want) {
    mp_fail(env, "out of memory for the reference (%zu bytes)", big * e);
    return 1;
  }
  size_t bad = 0;
  expected_recv(c, want);
  bad += compare(c, env, c->rbase, want, c->relems, 0, recv_name(c));
  if (c->sbase) {
    fill_input(c, want);
    bad += compare(c, env, c->sbase, want, c->selems, 0, "sendbuff (must stay unchanged)");
  }
  bad += (size_t)guards_changed(c, env);
  free(want);
  return bad ? 1 : 0;
}

uint64_t cc_hash(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
  return h;
}

int cc_same_everywhere(const mp_env* env, uint64_t h, int round, const char* what) {
  volatile int* counter = env->shm + CC_SHM_HASH;
  volatile uint64_t* table = (volatile uint64_t*)(env->shm + CC_SHM_HASH + 8);
  table += (size_t)(round & 1) * MP_MAX_RANKS;
  table[env->rank] = h;
  __atomic_fetch_add((int*)counter, 1, __ATOMIC_SEQ_CST);
  int want = env->nranks * (round + 1);
  double end = mp_now() + 60.0;
  while (__atomic_load_n((int*)counter, __ATOMIC_SEQ_CST) < want) {
    if (mp_now() > end) {
      mp_fail(env, "%s: timed out waiting for the other ranks' result hashes", what);
      return 1;
    }
    mp_sleep_ms(1);
  }
  int bad = 0;
  for (int r = 0; r < env->nranks; r++) {
    if (table[r] == h) continue;
    mp_fail(env, "%s: result differs from rank %d's (hash %016llx here, %016llx there)", what, r,
            (unsigned long long)h, (unsigned long long)table[r]);
    bad = 1;
  }
  return bad;
}

int cc_share_id(const mp_env* env, int maker, int slot, ncclUniqueId* id) {
  volatile int* base = env->shm + CC_SHM_ID + slot * CC_ID_INTS;
  if (env->rank == maker) {
    ncclResult_t rc = ncclGetUniqueId(id);
    if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclGetUniqueId (second comm)")) return 1;
    memcpy((void*)(base + 1), id, sizeof(*id));
    __atomic_store_n((int*)base, 1, __ATOMIC_SEQ_CST);
    return 0;
  }
  if (!mp_wait_flag(base, 60000)) {
    mp_fail(env, "timed out waiting for rank %d's unique id", maker);
    return 1;
  }
  memcpy(id, (const void*)(base + 1), sizeof(*id));
  return 0;
}
