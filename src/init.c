/*
 * Communicator lifecycle: ids, init (bootstrap, ring connections), the
 * single-process InitAll, finalize/destroy/abort and the small queries.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "core.h"
#include "group.h"
#include "param.h"
#include "socket.h"

#define CONFIG_MAGIC 0xcafebeefu

ncclResult_t braid_calloc(void* ptrp, size_t nelem, size_t elem_size) {
  void* p = calloc(nelem ? nelem : 1, elem_size);
  if (p == NULL) {
    WARN("Out of memory allocating %zu x %zu bytes", nelem, elem_size);
    return ncclSystemError;
  }
  *(void**)ptrp = p;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) {
    WARN("ncclGetVersion : version is NULL");
    return ncclInvalidArgument;
  }
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

static void print_version(void) {
  debug_log(DEBUG_VERSION, SUB_ALL, __FILE__, __LINE__, "Braid version %d.%d.%d (NCCL API)",
            NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

static void log_version_once(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (debug_level() >= DEBUG_VERSION) pthread_once(&once, print_version);
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == NULL) {
    WARN("ncclGetUniqueId : uniqueId is NULL");
    return ncclInvalidArgument;
  }
  log_version_once();
  return bootstrap_get_unique_id(uniqueId);
}

/* Copy what we know of a caller's config; a newer header's larger struct
 * is read up to our size and its extra fields ignored. */
static ncclResult_t config_read(const ncclConfig_t* user, ncclConfig_t* out) {
  ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  *out = def;
  if (user == NULL) return ncclSuccess;
  if (user->magic != CONFIG_MAGIC) {
    WARN("ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x%x)", user->magic);
    return ncclInvalidArgument;
  }
  if (user->size < offsetof(ncclConfig_t, blocking)) {
    WARN("ncclConfig_t size %zu is too small", user->size);
    return ncclInvalidArgument;
  }
  memcpy(out, user, MIN(user->size, sizeof(*out)));
  out->size = sizeof(*out);
  return ncclSuccess;
}

ncclResult_t comm_check(const struct ncclComm* comm, const char* fn) {
  if (comm == NULL) {
    WARN("%s : comm argument is NULL", fn);
    return ncclInvalidArgument;
  }
  if (comm->magic != COMM_MAGIC) {
    WARN("%s : comm %p is not a live communicator (destroyed?)", fn, (const void*)comm);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

static void comm_shutdown_conns(struct ncclComm* comm) {
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->send_conns && comm->send_conns[p])
      comm->send_conns[p]->ops->shutdown(comm->send_conns[p]);
    if (comm->recv_conns && comm->recv_conns[p])
      comm->recv_conns[p]->ops->shutdown(comm->recv_conns[p]);
  }
}

void comm_set_error(struct ncclComm* comm, ncclResult_t err) {
  int expected = ncclSuccess;
  if (err == ncclSuccess) return;
  if (atomic_compare_exchange_strong(&comm->error, &expected, (int)err))
    WARN("Rank %d: communicator failed (%s); shutting down its connections so peers notice",
         comm->rank, ncclGetErrorString(err));
  comm_shutdown_conns(comm);
}

static void comm_free(struct ncclComm* comm) {
  if (comm == NULL) return;
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->send_conns && comm->send_conns[p])
      comm->send_conns[p]->ops->close(comm->send_conns[p]);
    if (comm->recv_conns && comm->recv_conns[p])
      comm->recv_conns[p]->ops->close(comm->recv_conns[p]);
  }
  transport_parked_free(&comm->tctx);
  if (comm->tctx.listen_fd >= 0) close(comm->tctx.listen_fd);
  progress_destroy(&comm->progress);
  exec_free(&comm->exec);
  sched_free(&comm->sched);
  redop_free_all(comm);
  free(comm->send_conns);
  free(comm->recv_conns);
  free(comm->peers);
  comm->magic = 0;
  free(comm);
}

/* The peers this rank's algorithms talk to: ring neighbours and the
 * recursive-doubling partners. Links are symmetric (a partner both sends
 * to and receives from us), so one list serves both directions. */
static int comm_algo_peers(const struct ncclComm* comm, int* send, int* nsend, int* recv,
                           int* nrecv, int max) {
  int n = comm->nranks, r = comm->rank, rd[64];
  int nrd = rd_peers(r, n, rd, 64);
  *nsend = *nrecv = 0;
  send[(*nsend)++] = (r + 1) % n;
  recv[(*nrecv)++] = (r + n - 1) % n;
  for (int i = 0; i < nrd; i++) {
    int dup_s = 0, dup_r = 0;
    for (int j = 0; j < *nsend; j++) dup_s |= send[j] == rd[i];
    for (int j = 0; j < *nrecv; j++) dup_r |= recv[j] == rd[i];
    if (!dup_s && *nsend < max) send[(*nsend)++] = rd[i];
    if (!dup_r && *nrecv < max) recv[(*nrecv)++] = rd[i];
  }
  return *nsend + *nrecv;
}

/* Connect every peer the algorithms need. All sends are connected before
 * any receive is accepted, and a connect completes in the listener's
 * backlog, so no rank waits for another to reach accept. */
static ncclResult_t comm_connect_peers(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  int send[66], recv[66], nsend, nrecv;
  if (comm->nranks == 1) return ncclSuccess;
  comm_algo_peers(comm, send, &nsend, recv, &nrecv, 66);
  for (int i = 0; i < nsend; i++)
    CHECK(tcp_transport.connect_send(&comm->tctx, send[i], &comm->send_conns[send[i]]));
  for (int i = 0; i < nrecv; i++)
    CHECK(tcp_transport.connect_recv(&comm->tctx, recv[i], &comm->recv_conns[recv[i]]));
fail:
  return res;
}

static ncclResult_t comm_setup_local(struct ncclComm* comm, union socket_addr* listen) {
  ncclResult_t res = ncclSuccess;
  CHECK(progress_init(&comm->progress));
  CHECK(exec_init(&comm->exec, (int)param_nsteps(), (size_t)param_chunk_size()));
  CHECK(braid_calloc(&comm->peers, (size_t)comm->nranks, sizeof(struct peer_info)));
  CHECK(braid_calloc(&comm->send_conns, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->recv_conns, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(socket_local_addr(listen, NULL, 0));
  if (listen->sa.sa_family == AF_INET)
    listen->sin.sin_port = 0;
  else
    listen->sin6.sin6_port = 0;
  CHECK(socket_listen(listen, &comm->tctx.listen_fd));
fail:
  return res;
}

static ncclResult_t comm_init_rank(ncclComm_t* out, int nranks, const ncclUniqueId* uid, int rank,
                                   int cuda_dev, const ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = NULL;
  union socket_addr listen;
  struct bootstrap_id id;
  if (out == NULL) FAIL(ncclInvalidArgument, "ncclCommInitRank : comm pointer is NULL");
  *out = NULL;
  if (nranks < 1 || nranks > BOOTSTRAP_MAX_RANKS)
    FAIL(ncclInvalidArgument, "ncclCommInitRank : invalid nranks %d", nranks);
  if (rank < 0 || rank >= nranks)
    FAIL(ncclInvalidArgument, "ncclCommInitRank : rank %d out of range [0,%d)", rank, nranks);
  CHECK(bootstrap_id_decode(uid, &id));
  log_version_once();
  CHECK(braid_calloc(&comm, 1, sizeof(*comm)));
  comm->magic = COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->cuda_dev = cuda_dev;
  comm->id = id;
  comm->progress.epoll_fd = comm->progress.wake_fd = comm->tctx.listen_fd = -1;
  CHECK(config_read(config, &comm->config));
  debug_set_device(rank);
  CHECK(comm_setup_local(comm, &listen));
  comm->tctx = (struct transport_ctx){rank,
                                      nranks,
                                      id.secret,
                                      comm->peers,
                                      comm->tctx.listen_fd,
                                      comm->progress.epoll_fd,
                                      param_timeout_ms(),
                                      NULL};
  struct peer_info mine = {rank, (int32_t)getpid(), bootstrap_host_hash(), cuda_dev, 0, {0}};
  socket_addr_to_wire(&listen, &mine.listen);
  CHECK(bootstrap_maybe_start_root(&id, rank));
  CHECK(bootstrap_exchange(&id, rank, nranks, &mine, comm->peers,
                           socket_deadline(param_timeout_ms())));
  CHECK(comm_connect_peers(comm));
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Init COMPLETE", (void*)comm, rank, nranks);
  *out = comm;
  return ncclSuccess;
fail:
  comm_free(comm);
  return res;
}

/* An init issued inside ncclGroupStart/End runs at ncclGroupEnd. */
struct deferred_init {
  ncclComm_t* out;
  int nranks, rank, cuda_dev, has_config;
  ncclUniqueId id;
  ncclConfig_t config;
};

static ncclResult_t deferred_init_run(void* p) {
  struct deferred_init* d = p;
  ncclResult_t res = comm_init_rank(d->out, d->nranks, &d->id, d->rank, d->cuda_dev,
                                    d->has_config ? &d->config : NULL);
  free(d);
  return res;
}

static ncclResult_t init_rank_maybe_deferred(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                             const ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct deferred_init* d = NULL;
  if (group_depth() == 0) return comm_init_rank(out, nranks, &id, rank, -1, config);
  CHECK(braid_calloc(&d, 1, sizeof(*d)));
  *d = (struct deferred_init){out, nranks, rank, -1, config != NULL, id, NCCL_CONFIG_INITIALIZER};
  if (config) CHECK(config_read(config, &d->config));
  CHECK(group_add_job(deferred_init_run, d));
  return ncclSuccess;
fail:
  free(d);
  group_record_error(res);
  return res;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank_maybe_deferred(comm, nranks, commId, rank, NULL);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return init_rank_maybe_deferred(comm, nranks, commId, rank, config);
}

struct init_all_arg {
  ncclComm_t* out;
  int ndev, rank, dev;
  const ncclUniqueId* id;
  ncclResult_t result;
};

static void* init_all_main(void* p) {
  struct init_all_arg* a = p;
  a->result = comm_init_rank(a->out, a->ndev, a->id, a->rank, a->dev, NULL);
  return NULL;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ncclResult_t res = ncclSuccess;
  struct init_all_arg* args = NULL;
  pthread_t* threads = NULL;
  ncclUniqueId id;
  if (comms == NULL) FAIL(ncclInvalidArgument, "ncclCommInitAll : comms is NULL");
  if (ndev < 1) FAIL(ncclInvalidArgument, "ncclCommInitAll : invalid ndev %d", ndev);
  CHECK(ncclGetUniqueId(&id));
  CHECK(braid_calloc(&args, (size_t)ndev, sizeof(*args)));
  CHECK(braid_calloc(&threads, (size_t)ndev, sizeof(*threads)));
  for (int i = 0; i < ndev; i++) {
    args[i] = (struct init_all_arg){&comms[i], ndev, i, devlist ? devlist[i] : i, &id, ncclSuccess};
    if (pthread_create(&threads[i], NULL, init_all_main, &args[i]) != 0)
      FAIL(ncclSystemError, "ncclCommInitAll : cannot create thread %d", i);
  }
fail:
  for (int i = 0; threads && args && i < ndev; i++) {
    if (threads[i]) pthread_join(threads[i], NULL);
    if (res == ncclSuccess) res = args[i].result;
  }
  if (res != ncclSuccess && comms && args)
    for (int i = 0; i < ndev; i++)
      if (args[i].result == ncclSuccess && comms[i]) ncclCommDestroy(comms[i]), comms[i] = NULL;
  free(args);
  free(threads);
  return res;
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t res = comm_check(comm, "ncclCommFinalize");
  if (res != ncclSuccess) return res;
  /* Host calls complete before returning: nothing is left to flush. */
  comm->finalized = 1;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  ncclResult_t res = comm_check(comm, "ncclCommDestroy");
  if (res != ncclSuccess) return res;
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  comm_free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  ncclResult_t res = comm_check(comm, "ncclCommAbort");
  if (res != ncclSuccess) return res;
  atomic_store(&comm->aborted, 1);
  progress_wake(&comm->progress);
  comm_shutdown_conns(comm);
  /* A thread blocked in a collective wakes on the eventfd and leaves. */
  while (atomic_load(&comm->active) > 0) usleep(1000);
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  comm_free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t res = comm_check(comm, "ncclCommGetAsyncError");
  if (res != ncclSuccess) return res;
  if (asyncError == NULL) {
    WARN("ncclCommGetAsyncError : asyncError is NULL");
    return ncclInvalidArgument;
  }
  *asyncError = (ncclResult_t)atomic_load(&comm->error);
  return ncclSuccess;
}

/* The three queries share one shape: check, then read one field. */
static ncclResult_t comm_query(const struct ncclComm* comm, int* out, const char* fn, int value) {
  ncclResult_t res = comm_check(comm, fn);
  if (res != ncclSuccess) return res;
  if (out == NULL) {
    WARN("%s : output pointer is NULL", fn);
    return ncclInvalidArgument;
  }
  *out = value;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return comm_query(comm, count, "ncclCommCount", comm ? comm->nranks : 0);
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_query(comm, rank, "ncclCommUserRank", comm ? comm->rank : 0);
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_query(comm, device, "ncclCommCuDevice", comm ? comm->cuda_dev : 0);
}
