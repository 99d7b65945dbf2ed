/*
 * Bootstrap: ids and job keys, and the rank side of the peer-info
 * exchange (the root is bootstrap_root.c).
 */
#include "bootstrap/bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap_relay.h"
#include "bootstrap/bootstrap_root.h"
#include "core.h"
#include "host.h"
#include "param.h"

_Static_assert(sizeof(struct bootstrap_id) <= NCCL_UNIQUE_ID_BYTES, "id too large");

void bootstrap_id_encode(const struct bootstrap_id* id, ncclUniqueId* out) {
  memset(out, 0, sizeof(*out));
  memcpy(out->internal, id, sizeof(*id));
}

ncclResult_t bootstrap_id_decode(const ncclUniqueId* in, struct bootstrap_id* id) {
  union socket_addr addr;
  memcpy(id, in->internal, sizeof(*id));
  if (id->magic != BOOTSTRAP_MAGIC) {
    WARN("Invalid unique id: bad magic 0x%08x (not made by ncclGetUniqueId?)", id->magic);
    return ncclInvalidArgument;
  }
  if (id->version != BOOTSTRAP_VERSION) {
    WARN("Invalid unique id: version %u, this library speaks %u", id->version, BOOTSTRAP_VERSION);
    return ncclInvalidArgument;
  }
  if (socket_addr_from_wire(&id->root, &addr) != 0) {
    WARN("Invalid unique id: bad root address (family %u port %u)", id->root.family, id->root.port);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ---- ids and job keys ---- */

/* What tells one job from another that uses the same NCCL_COMM_ID: the
 * world size and whatever job id its launcher exports (Braid's own, Open
 * MPI / PMIx, Slurm, torchrun - whose restart count makes each restart a
 * job of its own, so a straggler of the last attempt cannot join). Braid's
 * own is a row of the parameter table; the launchers' are read with getenv:
 * they are not Braid's knobs, have no default, and their launchers
 * document them. */
static const char* const kJobVars[] = {
    "BRAID_JOB_ID", "WORLD_SIZE",    "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
    "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID",     "TORCHELASTIC_RESTART_COUNT",
};

static const char* job_var(size_t i) {
  if (i == 0) return param_job_id();
  return getenv(kJobVars[i]); /* not-a-param: the launcher's, see kJobVars */
}

/* splitmix64's finalizer: spreads FNV's weak low bits over the word. */
static uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t bootstrap_job_key(const char* comm_id) {
  char used[256] = "NCCL_COMM_ID";
  uint64_t h = braid_fnv1a(0x84222325cbf29ce4ull, comm_id, strlen(comm_id) + 1);
  for (size_t i = 0; i < sizeof(kJobVars) / sizeof(kJobVars[0]); i++) {
    const char* v = job_var(i);
    if (v == NULL) continue;
    h = braid_fnv1a(h, kJobVars[i], strlen(kJobVars[i]) + 1);
    h = braid_fnv1a(h, v, strlen(v) + 1);
    size_t n = strlen(used);
    snprintf(used + n, sizeof(used) - n, " + %s", kJobVars[i]);
  }
  INFO(SUB_BOOTSTRAP, "Bootstrap: job key from %s", used);
  return mix64(h);
}

ncclResult_t bootstrap_new_root_id(ncclUniqueId* out, struct bootstrap_root** root) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_id id = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0, {0}};
  union socket_addr addr;
  CHECK(socket_local_addr(&addr, NULL, 0));
  if (addr.sa.sa_family == AF_INET)
    addr.sin.sin_port = 0;
  else
    addr.sin6.sin6_port = 0;
  id.key = host_random64();
  CHECK(bootstrap_root_start(&addr, id.key, 0, root, NULL));
  socket_addr_to_wire(&addr, &id.root);
  bootstrap_id_encode(&id, out);
fail:
  return res;
}

ncclResult_t bootstrap_get_unique_id(ncclUniqueId* out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_id id = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0, {0}};
  union socket_addr addr;
  const char* env = param_comm_id();
  if (env == NULL) return bootstrap_new_root_id(out, NULL);
  CHECK(socket_parse_hostport(env, &addr));
  id.key = bootstrap_job_key(env);
  socket_addr_to_wire(&addr, &id.root);
  bootstrap_id_encode(&id, out);
fail:
  return res;
}

/* ---- a rank ---- */

/* Send a hello and read the root's reply header; the caller reads the
 * table that follows an ROOT_OK. */
static ncclResult_t rank_hello(const union socket_addr* root, const struct root_hello* h, int* fd,
                               struct root_reply* reply, uint64_t deadline_ns,
                               _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  CHECK(socket_connect(root, deadline_ns, aborted, fd));
  CHECK(socket_send_all(*fd, h, sizeof(*h), deadline_ns, aborted));
  CHECK(socket_recv_all(*fd, reply, sizeof(*reply), deadline_ns, aborted));
  if (reply->magic != BOOTSTRAP_MAGIC)
    FAIL(ncclSystemError, "Bootstrap: the root's reply is not Braid's");
fail:
  return res;
}

static const char* root_status_str(uint32_t status) {
  switch (status) {
    case ROOT_REFUSED:
      return "refused this rank: its job key or protocol differs (another job on this "
             "NCCL_COMM_ID? ranks must agree on NCCL_COMM_ID, WORLD_SIZE and the launcher's job "
             "id; see INFO/BOOTSTRAP)";
    case ROOT_CONFLICT:
      return "failed the bootstrap: two jobs use this address and job key, or ranks disagree on "
             "nranks (set BRAID_JOB_ID per job)";
    case ROOT_FAILED:
      return "failed the bootstrap: a rank died, or rank 0 aborted or timed out";
    default:
      return "sent an unknown status";
  }
}

ncclResult_t bootstrap_maybe_start_root(const struct bootstrap_id* id, int rank, int nranks,
                                        _Atomic int* aborted, struct bootstrap_root** out) {
  ncclResult_t res = ncclSuccess;
  const char* env = param_comm_id();
  union socket_addr addr;
  char buf[SOCKET_ADDR_STRLEN];
  int fd = -1, err = 0;
  *out = NULL;
  if (env == NULL || rank != 0 || id->key != bootstrap_job_key(env)) return ncclSuccess;
  socket_addr_from_wire(&id->root, &addr);
  if (bootstrap_root_start(&addr, id->key, nranks, out, &err) == ncclSuccess) return ncclSuccess;
  if (err == EADDRINUSE) { /* whoever holds it: if a root of our key, it fails too */
    struct root_hello h = {.magic = BOOTSTRAP_MAGIC,
                           .version = BOOTSTRAP_VERSION,
                           .key = id->key,
                           .nranks = nranks,
                           .flags = ROOT_HELLO_COLLISION,
                           .nroots = 1};
    struct root_reply r;
    if (rank_hello(&addr, &h, &fd, &r, socket_deadline(2000), aborted) == ncclSuccess)
      INFO(SUB_BOOTSTRAP, "Bootstrap: the root at %s was told of the collision",
           socket_addr_str(&addr, buf, sizeof(buf)));
  }
  FAIL(ncclSystemError,
       "Bootstrap: cannot serve NCCL_COMM_ID=%s: %s (another job, or a stale one, uses this "
       "address)",
       env, strerror(err));
fail:
  if (fd >= 0) close(fd);
  return res;
}

/* The ids of ncclCommInitRankScalable: rank's block's root and root 0. */
ncclResult_t bootstrap_ids_pick(const ncclUniqueId* ids, int nids, int rank, int nranks,
                                struct bootstrap_ids* out) {
  ncclResult_t res = ncclSuccess;
  int same = 1;
  if (nids < 1 || nids > nranks)
    FAIL(ncclInvalidArgument, "Bootstrap: %d ids for %d ranks (1 to nranks)", nids, nranks);
  for (int i = 0; i < nids; i++) {
    CHECK(bootstrap_id_decode(&ids[i], &out->mine));
    same &= memcmp(&ids[i], &ids[0], sizeof(ids[0])) == 0;
  }
  out->nroots = same ? 1 : nids; /* NCCL_COMM_ID's ids are all one */
  CHECK(bootstrap_id_decode(&ids[0], &out->first));
  CHECK(bootstrap_id_decode(&ids[bootstrap_block_of(rank, nranks, out->nroots)], &out->mine));
fail:
  return res;
}

/* The hello for this rank's root. */
static struct root_hello rank_hello_make(const struct bootstrap_ids* ids, int rank, int nranks,
                                         const struct peer_info* mine) {
  struct root_hello h = {.magic = BOOTSTRAP_MAGIC,
                         .version = BOOTSTRAP_VERSION,
                         .key = ids->mine.key,
                         .rank = rank,
                         .nranks = nranks,
                         .nroots = ids->nroots,
                         .root_index = bootstrap_block_of(rank, nranks, ids->nroots),
                         .info = *mine};
  if (ids->nroots > 1) h.first_key = ids->first.key, h.first = ids->first.root;
  return h;
}

/* The root's reply, checked: its table here, or the relay of its parent. */
static ncclResult_t rank_get_table(const struct root_reply* r, int fd, int rank, int nranks,
                                   struct peer_info* all, int ctrl_fd, uint64_t deadline_ns,
                                   _Atomic int* aborted, struct bootstrap_counts* counts) {
  ncclResult_t res = ncclSuccess;
  if (r->nranks != nranks)
    FAIL(ncclInternalError, "Bootstrap: the root answered rank %d for %d ranks", rank, r->nranks);
  if (r->parent < -1 || r->parent >= nranks || r->parent == rank || r->fanout < 1)
    FAIL(ncclInternalError, "Bootstrap: the root's reply to rank %d names parent %d fanout %d",
         rank, r->parent, r->fanout);
  if (r->parent >= 0)
    return bootstrap_relay_recv(ctrl_fd, r->parent, rank, nranks, r->data_secret, all, deadline_ns,
                                aborted, counts);
  CHECK(socket_recv_all(fd, all, sizeof(struct peer_info) * (size_t)nranks, deadline_ns, aborted));
  counts->bytes_in += sizeof(struct peer_info) * (size_t)nranks;
fail:
  return res;
}

ncclResult_t bootstrap_exchange(const struct bootstrap_ids* ids, int rank, int nranks,
                                const struct peer_info* mine, struct peer_info* all,
                                uint64_t* data_secret, int ctrl_fd, uint64_t deadline_ns,
                                _Atomic int* aborted, struct bootstrap_counts* counts) {
  ncclResult_t res = ncclSuccess;
  union socket_addr root;
  char buf[SOCKET_ADDR_STRLEN];
  int fd = -1;
  struct bootstrap_counts own = {0};
  struct root_hello h = rank_hello_make(ids, rank, nranks, mine);
  struct root_reply r;
  if (counts == NULL) counts = &own;
  socket_addr_from_wire(&ids->mine.root, &root);
  socket_addr_str(&root, buf, sizeof(buf));
  res = rank_hello(&root, &h, &fd, &r, deadline_ns, aborted);
  if (res != ncclSuccess)
    FAIL(res,
         "Bootstrap: rank %d got no answer from root %s (a rank died, timed out, or ids differ)",
         rank, buf);
  *counts = (struct bootstrap_counts){1, sizeof(h), 1, sizeof(r)};
  if (r.status != ROOT_OK)
    FAIL(ncclInvalidUsage, "Bootstrap: root %s %s", buf, root_status_str(r.status));
  CHECK(rank_get_table(&r, fd, rank, nranks, all, ctrl_fd, deadline_ns, aborted, counts));
  for (int i = 0; i < nranks; i++)
    if (all[i].rank != i) FAIL(ncclInternalError, "Bootstrap: corrupt peer table entry %d", i);
  *data_secret = r.data_secret;
  close(fd), fd = -1; /* the root is done with us: let it go before the relays */
  int block = bootstrap_block_of(rank, nranks, ids->nroots);
  bootstrap_relay_send(
      rank, nranks, all, r.data_secret, bootstrap_block_first(block, nranks, ids->nroots),
      bootstrap_block_size(block, nranks, ids->nroots), r.fanout, deadline_ns, aborted, counts);
  TRACE(SUB_BOOTSTRAP, "Bootstrap: rank %d sent %llu messages (%llu bytes), received %llu (%llu)",
        rank, (unsigned long long)counts->msgs_out, (unsigned long long)counts->bytes_out,
        (unsigned long long)counts->msgs_in, (unsigned long long)counts->bytes_in);
fail:
  if (fd >= 0) close(fd);
  return res;
}
