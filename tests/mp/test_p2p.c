/* Multi-process send/recv: call-order matching, grouped patterns in shuffled
 * order (all-to-all, gather, scatter, neighbours, self), multi-comm groups, bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collcheck.h"
#include "dtypes.h"
#include "launcher.h"

#define BIG_COUNT ((size_t)(1u << 20) + 3)
#define GUARD 64
#define GUARD_BYTE 0x5A
#define POISON 0xA5
#define MAX_MSGS 512

/* One message of a plan: the k-th from src to dst on comm `comm_ix`. */
typedef struct msg {
  int src, dst, k, comm_ix;
  size_t count;
  ncclDataType_t type;
} msg;

typedef struct plan {
  const char* name;
  int n;
  msg m[MAX_MSGS];
} plan;

/* This rank's side of one message: its guarded buffer. */
typedef struct slot {
  const msg* m;
  int is_send;
  unsigned char* base; /* guard + payload + guard */
} slot;

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void add(plan* p, int src, int dst, size_t count, ncclDataType_t type, int comm_ix) {
  if (p->n >= MAX_MSGS) return;
  int k = 0;
  for (int i = 0; i < p->n; i++)
    k += p->m[i].src == src && p->m[i].dst == dst && p->m[i].comm_ix == comm_ix;
  p->m[p->n++] = (msg){src, dst, k, comm_ix, count, type};
}

static size_t esz(const msg* m) {
  return mp_type(m->type)->size;
}

static unsigned char* payload(const slot* s) {
  return s->base + GUARD;
}

/* The bytes of message m (what the sender holds, the receiver must get). */
static void msg_bytes(const msg* m, uint64_t salt, unsigned char* out) {
  uint64_t seed = mix64(salt ^ ((uint64_t)m->src << 48) ^ ((uint64_t)m->dst << 32) ^
                        ((uint64_t)m->k << 16) ^ (uint64_t)m->comm_ix);
  size_t bytes = m->count * esz(m);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t h = mix64(seed + i);
    memcpy(out + i, &h, bytes - i < 8 ? bytes - i : 8);
  }
}

static void describe(const msg* m, const char* plan_name, char* buf, size_t n) {
  snprintf(buf, n, "%s: message %d from rank %d to rank %d (comm %d) type=%s count=%zu", plan_name,
           m->k, m->src, m->dst, m->comm_ix, mp_type(m->type)->name, m->count);
}

/* The slots of rank `me` (as seen on each comm: rank me everywhere here). */
static int make_slots(const plan* p, int me, uint64_t salt, slot* s, int* ns) {
  *ns = 0;
  for (int i = 0; i < p->n; i++) {
    const msg* m = &p->m[i];
    for (int side = 0; side < 2; side++) {
      if ((side == 0 && m->src != me) || (side == 1 && m->dst != me)) continue;
      size_t bytes = m->count * esz(m);
      slot* t = &s[(*ns)++];
      t->m = m;
      t->is_send = side == 0;
      t->base = malloc(bytes + 2 * GUARD);
      if (!t->base) return -1;
      memset(t->base, GUARD_BYTE, bytes + 2 * GUARD);
      if (t->is_send)
        msg_bytes(m, salt, payload(t));
      else
        memset(payload(t), POISON, bytes);
    }
  }
  return 0;
}

static void free_slots(slot* s, int ns) {
  for (int i = 0; i < ns; i++) free(s[i].base);
}

/* Fisher-Yates with a per-rank seed: every rank issues in its own order. */
static void shuffle(slot* s, int ns, uint64_t seed) {
  for (int i = ns - 1; i > 0; i--) {
    int j = (int)(mix64(seed + (uint64_t)i) % (uint64_t)(i + 1));
    slot t = s[i];
    s[i] = s[j];
    s[j] = t;
  }
}

/* Keeps messages between the same pair (and direction) in call order after
 * a shuffle: swaps such slots back into ascending k. */
static void keep_pair_order(slot* s, int ns) {
  for (int i = 0; i < ns; i++)
    for (int j = i + 1; j < ns; j++) {
      const msg *a = s[i].m, *b = s[j].m;
      if (s[i].is_send == s[j].is_send && a->src == b->src && a->dst == b->dst &&
          a->comm_ix == b->comm_ix && a->k > b->k) {
        slot t = s[i];
        s[i] = s[j];
        s[j] = t;
      }
    }
}

static ncclResult_t issue(const slot* s, ncclComm_t comm, int me) {
  const msg* m = s->m;
  if (s->is_send) return ncclSend(payload(s), m->count, m->type, m->dst, comm, NULL);
  (void)me;
  return ncclRecv(payload(s), m->count, m->type, m->src, comm, NULL);
}

static int verify_slots(const mp_env* env, const plan* p, const slot* s, int ns, uint64_t salt) {
  int bad = 0;
  for (int i = 0; i < ns; i++) {
    const msg* m = s[i].m;
    size_t e = esz(m), bytes = m->count * e;
    unsigned char* want = malloc(bytes + 1);
    if (!want) return bad + 1;
    msg_bytes(m, salt, want);
    const unsigned char* got = payload(&s[i]);
    char d[200];
    describe(m, p->name, d, sizeof(d));
    if (memcmp(got, want, bytes) != 0) {
      size_t wrong = 0;
      for (size_t j = 0; j < m->count; j++) {
        if (memcmp(got + j * e, want + j * e, e) == 0) continue;
        if (wrong++ < 3) {
          char w[64], g[64];
          mp_format(m->type, want + j * e, w, sizeof(w));
          mp_format(m->type, got + j * e, g, sizeof(g));
          mp_fail(env, "%s: %s[%zu] expected %s got %s", d,
                  s[i].is_send ? "sendbuff (must stay unchanged)" : "recvbuff", j, w, g);
        }
      }
      mp_fail(env, "%s: %zu of %zu elements wrong", d, wrong, m->count);
      bad++;
    }
    for (size_t g = 0; g < GUARD; g++) {
      if (s[i].base[g] == GUARD_BYTE && s[i].base[GUARD + bytes + g] == GUARD_BYTE) continue;
      mp_fail(env, "%s: %s written outside its bounds", d, s[i].is_send ? "sendbuff" : "recvbuff");
      bad++;
      break;
    }
    free(want);
  }
  return bad;
}

/* Runs plan p on comms (comm_ix indexes it) in one group, this rank's calls
 * in a shuffled order; verifies. Returns failures, -1 when a call failed. */
static int run_plan(const mp_env* env, ncclComm_t* comms, const plan* p, uint64_t salt,
                    int grouped) {
  slot* s = calloc(2 * MAX_MSGS, sizeof(slot));
  int ns = 0, bad = 0;
  if (!s || make_slots(p, env->rank, salt, s, &ns) != 0) {
    mp_fail(env, "%s: out of memory", p->name);
    free_slots(s, ns);
    free(s);
    return -1;
  }
  if (grouped) {
    shuffle(s, ns, mix64(salt ^ (uint64_t)env->rank));
    keep_pair_order(s, ns);
    bad += mp_expect_rc(env, comms[0], ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  }
  for (int i = 0; i < ns && !bad; i++) {
    ncclResult_t rc = issue(&s[i], comms[s[i].m->comm_ix], env->rank);
    if (rc == ncclSuccess) continue;
    char d[200];
    describe(s[i].m, p->name, d, sizeof(d));
    mp_fail(env, "%s: %s returned %d (%s): \"%s\"", d, s[i].is_send ? "ncclSend" : "ncclRecv",
            (int)rc, ncclGetErrorString(rc), ncclGetLastError(comms[s[i].m->comm_ix]));
    bad++;
  }
  if (grouped) {
    char what[96];
    snprintf(what, sizeof(what), "ncclGroupEnd (%s)", p->name);
    bad += mp_expect_rc(env, comms[0], ncclGroupEnd(), ncclSuccess, what);
  }
  int r = bad ? -1 : verify_slots(env, p, s, ns, salt);
  free_slots(s, ns);
  free(s);
  return r;
}

/* ---- plans ---- */

static ncclDataType_t type_of(int i) {
  return (ncclDataType_t)((i * 7 + 3) % ncclNumTypes);
}

static void plan_alltoall(plan* p, int n, size_t count, int per_pair) {
  p->name = per_pair > 1 ? "all-to-all x2" : "all-to-all";
  for (int k = 0; k < per_pair; k++)
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        add(p, s, d, count + (size_t)(s * 3 + d + 11 * k), type_of(s + d + k), 0);
}

static void plan_gather(plan* p, int n, int root) {
  p->name = "gather";
  for (int s = 0; s < n; s++) add(p, s, root, 1000 + (size_t)s, ncclFloat32, 0);
}

static void plan_scatter(plan* p, int n, int root) {
  p->name = "scatter";
  for (int d = 0; d < n; d++) add(p, root, d, 333 * (size_t)(d + 1), ncclUint8, 0);
}

static void plan_neighbours(plan* p, int n) {
  p->name = "neighbour exchange";
  for (int k = 0; k < 2; k++)
    for (int s = 0; s < n; s++) {
      add(p, s, (s + 1) % n, 4099 + (size_t)k, ncclInt32, 0);
      add(p, s, (s + n - 1) % n, 17 + (size_t)k * 1000, ncclFloat64, 0);
    }
}

static void plan_self(plan* p, int n) {
  p->name = "send/recv to self";
  for (int k = 0; k < 3; k++)
    for (int s = 0; s < n; s++) add(p, s, s, 100 + (size_t)k * 5000, type_of(k), 0);
}

static void plan_zero(plan* p, int n) {
  p->name = "zero-count messages";
  for (int s = 0; s < n; s++) {
    add(p, s, (s + 1) % n, 0, ncclFloat32, 0);
    add(p, s, (s + 1) % n, 5, ncclFloat32, 0);
    add(p, s, (s + n - 1) % n, 0, ncclInt8, 0);
  }
}

static void plan_big(plan* p, int n) {
  p->name = "big all-to-all";
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++) add(p, s, d, BIG_COUNT + (size_t)(s + d), ncclFloat32, 0);
}

typedef struct run_ctx {
  const mp_env* env;
  ncclComm_t comm;
  int salt;
  int bad;
  int fatal;
} run_ctx;

static void run_one(run_ctx* c, const plan* p, int grouped) {
  if (c->fatal) return;
  int r = run_plan(c->env, &c->comm, p, 1000u + (uint64_t)c->salt++, grouped);
  if (r < 0) c->fatal = 1;
  if (r > 0) c->bad++;
}

static int finish(const mp_env* env, ncclComm_t comm, int bad, int fatal) {
  if (fatal) {
    ncclCommAbort(comm);
    return 1;
  }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

/* ---- ungrouped: blocking send/recv matched per pair in call order ---- */

static void ungrouped(run_ctx* c) {
  int n = c->env->nranks, me = c->env->rank, a = me & ~1, b = a + 1;
  if (b >= n || c->fatal) return; /* an odd last rank sits this one out */
  /* pair (a, b): a sends 3 then receives 3, b receives 3 then sends 3; the
   * slots come in plan order, which is exactly that on both sides. */
  plan p = {.name = "ungrouped pair"};
  for (int k = 0; k < 3; k++) add(&p, a, b, 10 + (size_t)k * 4000, type_of(k), 0);
  for (int k = 0; k < 3; k++) add(&p, b, a, 7 + (size_t)k, type_of(k + 5), 0);
  slot s[12];
  int ns = 0;
  uint64_t salt = 77;
  if (make_slots(&p, me, salt, s, &ns) != 0) {
    c->fatal = 1;
    return;
  }
  for (int i = 0; i < ns && !c->fatal; i++) {
    ncclResult_t rc = issue(&s[i], c->comm, me);
    if (rc != ncclSuccess) {
      mp_fail(c->env, "ungrouped %s to/from %d returned %d (%s): \"%s\"",
              s[i].is_send ? "ncclSend" : "ncclRecv", me ^ 1, (int)rc, ncclGetErrorString(rc),
              ncclGetLastError(c->comm));
      c->fatal = 1;
    }
  }
  if (!c->fatal && verify_slots(c->env, &p, s, ns, salt)) c->bad++;
  free_slots(s, ns);
}

static int p2p_body(const mp_env* env) {
  run_ctx c = {.env = env};
  if (mp_comm_init(env, &c.comm) != 0) return 1;
  int n = env->nranks;
  double t0 = mp_now();
  plan* p = calloc(1, sizeof(plan));
  if (!p) return finish(env, c.comm, 0, 1);
#define PLAN(stmt, grouped)   \
  do {                        \
    memset(p, 0, sizeof(*p)); \
    stmt;                     \
    run_one(&c, p, grouped);  \
  } while (0)
  PLAN(plan_alltoall(p, n, 1, 1), 1);
  PLAN(plan_alltoall(p, n, 1023, 2), 1);
  PLAN(plan_gather(p, n, 0), 1);
  PLAN(plan_gather(p, n, n - 1), 1);
  PLAN(plan_scatter(p, n, n / 2), 1);
  PLAN(plan_neighbours(p, n), 1);
  PLAN(plan_self(p, n), 1);
  PLAN(plan_zero(p, n), 1);
  if (n <= 5) PLAN(plan_big(p, n), 1);
  PLAN(plan_alltoall(p, n, 65537, 1), 1);
#undef PLAN
  ungrouped(&c);
  free(p);
  if (env->rank == 0 || c.bad || c.fatal)
    mp_log(env, "p2p: %d plans, %d wrong%s, %.1f s", c.salt, c.bad,
           c.fatal ? ", a call failed" : "", mp_now() - t0);
  return finish(env, c.comm, c.bad, c.fatal);
}

static void test_patterns(void** state) {
  (void)state;
  static const int sizes[] = {1, 2, 3, 5, 8};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(sizes[i], p2p_body, NULL, NULL), 0);
}

/* ---- a group mixing collectives and send/recv ---- */

static int mixed_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int n = env->nranks, bad = 0;
  for (int round = 0; round < 3 && !bad; round++) {
    cc_call cc[3] = {
        {.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 70001},
        {.coll = CC_BROADCAST, .type = ncclInt64, .count = 1023, .root = (round + 1) % n},
        {.coll = CC_REDUCESCATTER, .type = ncclBfloat16, .kind = AR_MAX, .count = 4099},
    };
    plan* p = calloc(1, sizeof(plan));
    slot* s = calloc(2 * MAX_MSGS, sizeof(slot));
    int ns = 0;
    uint64_t salt = 300u + (uint64_t)round;
    if (!p || !s) return 1;
    p->name = "mixed group";
    plan_neighbours(p, n);
    add(p, 0, n - 1, 12345, ncclFloat16, 0);
    for (int i = 0; i < 3; i++) {
      cc[i].salt = salt + (uint64_t)i;
      cc[i].inplace = (round + i) & 1;
      if (cc_is_reduction(cc[i].coll)) ar_op_create(env, comm, cc[i].type, cc[i].kind, &cc[i].op);
      if (cc_prepare(&cc[i], env) != 0) return 1;
    }
    if (make_slots(p, env->rank, salt, s, &ns) != 0) return 1;
    shuffle(s, ns, mix64(salt + (uint64_t)env->rank));
    keep_pair_order(s, ns);
    bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    /* p2p calls before, between and after the collectives */
    int per = (ns + 3) / 4;
    for (int part = 0, i = 0; part < 4; part++) {
      for (int j = 0; j < per && i < ns; j++, i++) {
        ncclResult_t rc = issue(&s[i], comm, env->rank);
        bad += mp_expect_rc(env, comm, rc, ncclSuccess, s[i].is_send ? "ncclSend" : "ncclRecv");
      }
      if (part < 3) {
        ncclResult_t rc = cc_issue(&cc[part], comm, NULL);
        if (rc != ncclSuccess) cc_report_rc(&cc[part], env, comm, rc), bad++;
      }
    }
    bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (mixed group)");
    if (!bad) bad += verify_slots(env, p, s, ns, salt);
    for (int i = 0; i < 3; i++) {
      if (!bad) bad += cc_verify(&cc[i], env);
      cc_release(&cc[i]);
    }
    free_slots(s, ns);
    free(s);
    free(p);
  }
  return finish(env, comm, bad, bad != 0);
}

static void test_group_mixed(void** state) {
  (void)state;
  static const int sizes[] = {2, 3, 5};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(sizes[i], mixed_body, NULL, NULL), 0);
}

/* ---- groups spanning several communicators ---- */

/* ncclCommInitAll: one process, one thread, n comms: an all-to-all where the
 * rank of message endpoints is the comm index; all comms in one group. */
static int initall_body(const mp_env* env) {
  int n = *(const int*)env->arg, bad = 0;
  ncclComm_t comms[8] = {NULL};
  if (mp_expect_rc(env, NULL, ncclCommInitAll(comms, n, NULL), ncclSuccess, "ncclCommInitAll"))
    return 1;
  plan* p = calloc(1, sizeof(plan));
  slot* s = calloc(2 * MAX_MSGS, sizeof(slot));
  slot** mine = calloc((size_t)n, sizeof(slot*));
  int* ns = calloc((size_t)n, sizeof(int));
  if (!p || !s || !mine || !ns) return 1;
  plan_alltoall(p, n, 333, 2);
  p->name = "InitAll all-to-all";
  for (int i = 0; i < p->n; i++) p->m[i].comm_ix = 0; /* comm chosen by endpoint below */
  for (int r = 0, used = 0; r < n; r++) {
    mine[r] = s + used;
    if (make_slots(p, r, 5, mine[r], &ns[r]) != 0) return 1;
    used += ns[r];
  }
  int total = 0;
  for (int r = 0; r < n; r++) total += ns[r];
  /* one shuffled order over every comm's calls */
  typedef struct call {
    int r;
    slot* s;
  } call;
  call* calls = calloc((size_t)total, sizeof(call));
  if (!calls) return 1;
  for (int r = 0, k = 0; r < n; r++)
    for (int i = 0; i < ns[r]; i++) calls[k++] = (call){r, &mine[r][i]};
  for (int i = total - 1; i > 0; i--) {
    int j = (int)(mix64((uint64_t)i * 31u) % (uint64_t)(i + 1));
    call t = calls[i];
    calls[i] = calls[j];
    calls[j] = t;
  }
  /* restore per-pair call order for the same comm (k ascending) */
  for (int i = 0; i < total; i++)
    for (int j = i + 1; j < total; j++) {
      const slot *a = calls[i].s, *b = calls[j].s;
      if (calls[i].r == calls[j].r && a->is_send == b->is_send && a->m->src == b->m->src &&
          a->m->dst == b->m->dst && a->m->k > b->m->k) {
        call t = calls[i];
        calls[i] = calls[j];
        calls[j] = t;
      }
    }
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int i = 0; i < total; i++) {
    ncclResult_t rc = issue(calls[i].s, comms[calls[i].r], calls[i].r);
    bad += mp_expect_rc(env, comms[calls[i].r], rc, ncclSuccess, "send/recv on an InitAll comm");
  }
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (InitAll comms)");
  for (int r = 0; r < n && !bad; r++) {
    mp_env er = *env;
    er.rank = r;
    er.nranks = n;
    bad += verify_slots(&er, p, mine[r], ns[r], 5);
  }
  for (int r = 0; r < n; r++) free_slots(mine[r], ns[r]);
  for (int r = 0; r < n; r++) {
    if (bad)
      ncclCommAbort(comms[r]);
    else
      bad += mp_expect_rc(env, comms[r], ncclCommDestroy(comms[r]), ncclSuccess, "Destroy");
  }
  free(calls);
  free(ns);
  free(mine);
  free(s);
  free(p);
  return bad != 0;
}

static void test_group_initall(void** state) {
  (void)state;
  static const int sizes[] = {2, 3, 4};
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(1, initall_body, (void*)&sizes[i], &o), 0);
}

/* Two comms of the same ranks: sends on one, receives on the other, an
 * all-reduce on the second, all in one group. */
static int two_comms_body(const mp_env* env) {
  ncclComm_t comms[2] = {NULL, NULL};
  ncclUniqueId id2;
  int n = env->nranks, bad = 0;
  if (mp_comm_init(env, &comms[0]) != 0) return 1;
  if (cc_share_id(env, 0, 0, &id2) != 0) return 1;
  ncclResult_t rc = ncclCommInitRank(&comms[1], n, id2, env->rank);
  if (mp_expect_rc(env, NULL, rc, ncclSuccess, "ncclCommInitRank (second comm)")) return 1;
  plan* p = calloc(1, sizeof(plan));
  slot* s = calloc(2 * MAX_MSGS, sizeof(slot));
  int ns = 0;
  if (!p || !s) return 1;
  p->name = "two comms";
  for (int r = 0; r < n; r++) {
    add(p, r, (r + 1) % n, 5000, ncclFloat32, 0);
    add(p, r, (r + n - 1) % n, 3000, ncclInt8, 1);
    add(p, r, (r + 2) % n, 77, ncclUint64, 1);
    add(p, r, r, 10, ncclFloat16, 1);
  }
  cc_call ar = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 10007};
  ar.salt = 42;
  ar_op_create(env, comms[1], ar.type, ar.kind, &ar.op);
  if (make_slots(p, env->rank, 9, s, &ns) != 0 || cc_prepare(&ar, env) != 0) return 1;
  shuffle(s, ns, (uint64_t)env->rank * 13u);
  keep_pair_order(s, ns);
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int i = 0; i < ns; i++) {
    if (i == ns / 2) {
      rc = cc_issue(&ar, comms[1], NULL);
      if (rc != ncclSuccess) cc_report_rc(&ar, env, comms[1], rc), bad++;
    }
    rc = issue(&s[i], comms[s[i].m->comm_ix], env->rank);
    bad += mp_expect_rc(env, comms[s[i].m->comm_ix], rc, ncclSuccess, "send/recv");
  }
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (two comms)");
  if (!bad) bad += verify_slots(env, p, s, ns, 9) + cc_verify(&ar, env);
  cc_release(&ar);
  free_slots(s, ns);
  free(s);
  free(p);
  for (int i = 0; i < 2; i++) {
    if (bad)
      ncclCommAbort(comms[i]);
    else
      bad += mp_expect_rc(env, comms[i], ncclCommDestroy(comms[i]), ncclSuccess, "Destroy");
  }
  return bad != 0;
}

static void test_group_two_comms(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, two_comms_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(2, two_comms_body, NULL, NULL), 0);
}

/* ---- the sender leaves first ---- */

#define LEAVE_BYTES ((size_t)1 << 20)

/* Rank 0's send completes once its bytes are in the transport; it then
 * destroys its comm and exits before rank 1 even posts the receive. The
 * bytes must still arrive (shared memory lost them: the sender's close
 * unlinked a segment the receiver had not mapped yet). */
static int sender_leaves_body(const mp_env* env) {
  const int* shm_off = env->arg;
  ncclComm_t comm = NULL;
  unsigned char* buf = malloc(LEAVE_BYTES);
  int bad = 0;
  if (*shm_off) setenv("NCCL_SHM_DISABLE", "1", 1);
  if (buf == NULL || mp_comm_init(env, &comm) != 0) return 1;
  for (size_t i = 0; i < LEAVE_BYTES && env->rank == 0; i++) buf[i] = (unsigned char)(i * 13u);
  if (env->rank == 0) {
    bad += mp_expect_rc(env, comm, ncclSend(buf, LEAVE_BYTES, ncclUint8, 1, comm, NULL),
                        ncclSuccess, "ncclSend");
  } else {
    memset(buf, 0, LEAVE_BYTES);
    mp_sleep_ms(1000); /* rank 0 has destroyed its comm and exited by now */
    bad += mp_expect_rc(env, comm, ncclRecv(buf, LEAVE_BYTES, ncclUint8, 0, comm, NULL),
                        ncclSuccess, "ncclRecv after the sender left");
    for (size_t i = 0; i < LEAVE_BYTES && bad == 0; i++)
      if (buf[i] != (unsigned char)(i * 13u)) {
        mp_fail(env, "byte %zu of the message is %u", i, buf[i]);
        bad++;
      }
  }
  free(buf);
  return finish(env, comm, bad, 0);
}

static void test_sender_leaves_first(void** state) {
  (void)state;
  for (int shm_off = 0; shm_off < 2; shm_off++)
    assert_int_equal(mp_launch(2, sender_leaves_body, &shm_off, NULL), 0);
}

/* ---- bad input ---- */

typedef struct bad_ctx {
  const mp_env* env;
  ncclComm_t comm;
  float buf[16];
} bad_ctx;

typedef struct bad_check {
  const char* what;
  ncclResult_t (*fn)(bad_ctx* c);
  int use_comm;
} bad_check;

static ncclResult_t send_null_buf(bad_ctx* c) {
  return ncclSend(NULL, 8, ncclFloat, 0, c->comm, NULL);
}
static ncclResult_t recv_null_buf(bad_ctx* c) {
  return ncclRecv(NULL, 8, ncclFloat, 0, c->comm, NULL);
}
static ncclResult_t send_null_comm(bad_ctx* c) {
  return ncclSend(c->buf, 8, ncclFloat, 0, NULL, NULL);
}
static ncclResult_t recv_null_comm(bad_ctx* c) {
  return ncclRecv(c->buf, 8, ncclFloat, 0, NULL, NULL);
}
static ncclResult_t send_peer_neg(bad_ctx* c) {
  return ncclSend(c->buf, 8, ncclFloat, -1, c->comm, NULL);
}
static ncclResult_t recv_peer_neg(bad_ctx* c) {
  return ncclRecv(c->buf, 8, ncclFloat, -1, c->comm, NULL);
}
static ncclResult_t send_peer_n(bad_ctx* c) {
  return ncclSend(c->buf, 8, ncclFloat, c->env->nranks, c->comm, NULL);
}
static ncclResult_t recv_peer_n(bad_ctx* c) {
  return ncclRecv(c->buf, 8, ncclFloat, c->env->nranks, c->comm, NULL);
}
static ncclResult_t send_peer_big(bad_ctx* c) {
  return ncclSend(c->buf, 8, ncclFloat, 1000, c->comm, NULL);
}
static ncclResult_t send_type_bad(bad_ctx* c) {
  return ncclSend(c->buf, 8, (ncclDataType_t)ncclNumTypes, 0, c->comm, NULL);
}
static ncclResult_t recv_type_neg(bad_ctx* c) {
  return ncclRecv(c->buf, 8, (ncclDataType_t)-1, 0, c->comm, NULL);
}

static const bad_check kBad[] = {
    {"ncclSend(sendbuff=NULL, count=8)", send_null_buf, 1},
    {"ncclRecv(recvbuff=NULL, count=8)", recv_null_buf, 1},
    {"ncclSend(comm=NULL)", send_null_comm, 0},
    {"ncclRecv(comm=NULL)", recv_null_comm, 0},
    {"ncclSend(peer=-1)", send_peer_neg, 1},
    {"ncclRecv(peer=-1)", recv_peer_neg, 1},
    {"ncclSend(peer=nranks)", send_peer_n, 1},
    {"ncclRecv(peer=nranks)", recv_peer_n, 1},
    {"ncclSend(peer=1000)", send_peer_big, 1},
    {"ncclSend(datatype=ncclNumTypes)", send_type_bad, 1},
    {"ncclRecv(datatype=-1)", recv_type_neg, 1},
};
#define NBAD (sizeof(kBad) / sizeof(kBad[0]))

static int is_arg_error(ncclResult_t rc) {
  return rc == ncclInvalidArgument || rc == ncclInvalidUsage;
}

/* Outside a group: the call itself must fail. */
static int bad_plain(bad_ctx* c, const bad_check* k) {
  ncclComm_t lc = k->use_comm ? c->comm : NULL;
  ncclResult_t rc = k->fn(c);
  if (!is_arg_error(rc)) {
    mp_fail(c->env, "%s returned %d (%s), expected ncclInvalidArgument or ncclInvalidUsage",
            k->what, (int)rc, ncclGetErrorString(rc));
    return 1;
  }
  return mp_expect_last_error(c->env, lc, k->what);
}

/* Inside a group (alone, or with a valid self exchange): the call and/or
 * ncclGroupEnd must report it; neither may hang. */
static int bad_grouped(bad_ctx* c, const bad_check* k, int with_valid) {
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  int bad = 0;
  char what[160];
  snprintf(what, sizeof(what), "in a group%s: %s", with_valid ? " with a valid self exchange" : "",
           k->what);
  bad += mp_expect_rc(c->env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  ncclResult_t r1 = ncclSuccess, r2;
  if (with_valid) r1 = ncclSend(a, 4, ncclFloat, c->env->rank, c->comm, NULL);
  ncclResult_t rc = k->fn(c);
  if (with_valid && r1 == ncclSuccess) r1 = ncclRecv(b, 4, ncclFloat, c->env->rank, c->comm, NULL);
  r2 = ncclGroupEnd();
  if (r1 != ncclSuccess && !is_arg_error(r1)) {
    mp_fail(c->env, "%s: the valid call returned %d (%s)", what, (int)r1, ncclGetErrorString(r1));
    bad++;
  }
  if ((rc != ncclSuccess && !is_arg_error(rc)) || (r2 != ncclSuccess && !is_arg_error(r2)) ||
      (rc == ncclSuccess && r2 == ncclSuccess)) {
    mp_fail(c->env, "%s: call returned %d (%s), ncclGroupEnd %d (%s); expected an argument error",
            what, (int)rc, ncclGetErrorString(rc), (int)r2, ncclGetErrorString(r2));
    bad++;
  } else {
    bad += mp_expect_last_error(c->env, k->use_comm ? c->comm : NULL, what);
  }
  return bad;
}

/* The comm still exchanges with both neighbours. */
static int still_works(bad_ctx* c, int i) {
  plan* p = calloc(1, sizeof(plan));
  if (!p) return 1;
  plan_neighbours(p, c->env->nranks);
  p->name = "exchange after a rejected call";
  int r = run_plan(c->env, &c->comm, p, 500u + (uint64_t)i, 1);
  free(p);
  if (r != 0) mp_fail(c->env, "the comm no longer works after \"%s\"", kBad[i % NBAD].what);
  return r != 0;
}

static int bad_body(const mp_env* env) {
  bad_ctx c = {.env = env};
  memset(c.buf, 0, sizeof(c.buf));
  if (mp_comm_init(env, &c.comm) != 0) return 1;
  int bad = 0;
  for (size_t i = 0; i < NBAD && !bad; i++) {
    bad += bad_plain(&c, &kBad[i]);
    bad += bad_grouped(&c, &kBad[i], 0);
    bad += bad_grouped(&c, &kBad[i], 1);
    bad += still_works(&c, (int)i);
  }
  if (env->rank == 0 || bad) mp_log(env, "p2p bad input: %d failed checks", bad);
  return finish(env, c.comm, bad, 0);
}

static void test_bad_input(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, bad_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(1, bad_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_patterns),      cmocka_unit_test(test_group_mixed),
      cmocka_unit_test(test_group_initall), cmocka_unit_test(test_group_two_comms),
      cmocka_unit_test(test_bad_input),     cmocka_unit_test(test_sender_leaves_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
