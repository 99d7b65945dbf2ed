/*
 * Communicator creation: ids, config, init (blocking, inside a group, or
 * non-blocking on the comm's own stream), InitAll with ranks as threads, and
 * InitRankScalable. Connections are made later, when work first needs them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap_root.h"
#include "braid.h"
#include "comm/comm.h"
#include "status/flight.h"
#include "status/status_service.h"
#include "comm/comm_ctrl.h"
#include "comm/comm_init.h"
#include "comm/comm_teardown.h"
#include "core.h"
#include "engine/device.h"
#include "engine/exec_cpu.h"
#include "api/group.h"
#include "host.h"
#include "layout.h"
#include "param.h"
#include "socket.h"
#include "engine/stream.h"
#include "topo/topo.h"
#include "topo/topo_bind.h"
#include "topo/topo_nic.h"
#include "transport_table.h"
#include "tune/tuner.h"

#define CONFIG_MAGIC 0xcafebeefu

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) {
    WARN("ncclGetVersion : version is NULL");
    return ncclInvalidArgument;
  }
  *version = BRAID_NCCL_LEVEL;
  return ncclSuccess;
}

/* NCCL's banner, with Braid's mark where NVIDIA's names its CUDA: the
 * level ncclGetVersion reports, then the API of the header. */
static void print_version(void) {
  debug_log(DEBUG_VERSION, SUB_ALL, __FILE__, __LINE__,
            "NCCL version %d.%d.%d+braid (Braid: the NCCL %d.%d.%d API)", BRAID_NCCL_LEVEL / 10000,
            BRAID_NCCL_LEVEL / 100 % 100, BRAID_NCCL_LEVEL % 100, NCCL_MAJOR, NCCL_MINOR,
            NCCL_PATCH);
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
ncclResult_t comm_config_read(const ncclConfig_t* user, ncclConfig_t* out) {
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

/* ncclCommRegister'ed ranges reach the transports that pin or map memory;
 * a device buffer is exported for CUDA IPC once, not at every call. */
static ncclResult_t regs_attach(void* tctx, struct mem_reg* reg) {
  return transport_register(tctx, reg->base, reg->size, reg->handles);
}

static void regs_detach(void* tctx, struct mem_reg* reg) {
  transport_deregister(tctx, reg->handles);
}

/* The comm's executor context: its collective connections, its layout
 * (filled in at bootstrap; the key reads it per call) and abort flag. */
static ncclResult_t comm_exec_init(struct ncclComm* comm) {
  struct exec_conf conf = {.rank = comm->rank,
                           .nranks = comm->nranks,
                           .topo = &comm->layout,
                           .send_conns = comm->send_conns,
                           .recv_conns = comm->recv_conns,
                           .backend = &exec_backend_cpu,
                           .aborted = &comm->aborted,
                           .timeout_ms = param_timeout_ms(),
                           .window = (int)param_nsteps(),
                           .slot_bytes = (size_t)param_chunk_size()};
  return exec_init(&comm->exec, &conf);
}

static ncclResult_t comm_setup_local(struct ncclComm* comm, union socket_addr* listen) {
  ncclResult_t res = ncclSuccess;
  CHECK(progress_init(&comm->progress));
  CHECK(braid_calloc(&comm->peers, (size_t)comm->nranks, sizeof(struct peer_info)));
  CHECK(braid_calloc(&comm->send_conns, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->recv_conns, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->p2p_send, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->p2p_recv, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->p2p_send_dev, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->p2p_recv_dev, (size_t)comm->nranks, sizeof(struct transport_conn*)));
  CHECK(braid_calloc(&comm->peer_transport, (size_t)comm->nranks, sizeof(struct transport*)));
  CHECK(braid_calloc(&comm->peer_transport_dev, (size_t)comm->nranks, sizeof(struct transport*)));
  CHECK(comm_exec_init(comm));
  CHECK(socket_local_addr(listen, NULL, 0));
  if (listen->sa.sa_family == AF_INET)
    listen->sin.sin_port = 0;
  else
    listen->sin6.sin6_port = 0;
  CHECK(socket_listen(listen, &comm->tctx.listen_fd));
  union socket_addr ctrl = *listen;
  CHECK(ctrl_listen(comm, &ctrl));
  socket_addr_to_wire(&ctrl, &comm->ctrl_addr);
fail:
  return res;
}

/* Allocate and set up a comm without talking to anyone. */
static ncclResult_t comm_create(struct ncclComm** out, int nranks, const struct bootstrap_ids* ids,
                                int rank, int cuda_dev, const ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = NULL;
  union socket_addr listen;
  log_version_once();
  CHECK(braid_calloc(&comm, 1, sizeof(*comm)));
  atomic_init(&comm->refs, 1);
  atomic_init(&comm->deterministic, (int)param_deterministic());
  comm->magic = COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->cuda_dev = cuda_dev;
  comm->ids = *ids;
  comm->progress.epoll_fd = comm->progress.wake_fd = comm->tctx.listen_fd = comm->ctrl_fd = -1;
  comm->progress.bell_fd[0] = comm->progress.bell_fd[1] = -1;
  pthread_mutex_init(&comm->turn_lock, NULL);
  pthread_cond_init(&comm->turn_cv, NULL);
  pthread_mutex_init(&comm->mailbox.lock, NULL);
  pthread_cond_init(&comm->mailbox.cv, NULL);
  mem_regs_init(&comm->regs, &(struct mem_reg_hooks){regs_attach, regs_detach, &comm->tctx});
  CHECK(comm_registry_add(comm));
  CHECK(comm_config_read(config, &comm->config));
  atomic_init(&comm->nonblocking, comm->config.blocking == 0);
  CHECK(flight_init(&comm->flight));
  CHECK(comm_setup_local(comm, &listen));
  comm->tctx = (struct transport_ctx){
      .rank = rank,
      .nranks = nranks,
      .secret = 0, /* the data secret: the root hands it out */
      .peers = comm->peers,
      .listen_fd = comm->tctx.listen_fd,
      .epoll_fd = comm->progress.epoll_fd,
      .timeout_ms = param_timeout_ms(),
      .aborted = &comm->aborted,
      .waits = &comm->waits,
      .chosen = comm->peer_transport,
      .chosen_device = comm->peer_transport_dev,
  };
  CHECK(transport_table_init(&comm->tctx));
  *out = comm;
  return ncclSuccess;
fail:
  comm_free(comm);
  return res;
}

/* What this rank tells the others about itself and its host. */
static void comm_describe_self(struct ncclComm* comm, const struct topo_system* sys,
                               const char* ifname, struct peer_info* mine) {
  const struct topo_nic* nic = topo_nic_find(sys, ifname);
  *mine = (struct peer_info){.rank = comm->rank,
                             .pid = (int32_t)getpid(),
                             .host_hash = host_hash(),
                             .cuda_dev = comm->cuda_dev,
                             .ncpus = sys->ncores > 0 ? sys->ncores : sys->npus,
                             .nic_mbps = nic && nic->speed_mbps > 0 ? (uint32_t)nic->speed_mbps : 0,
                             .mem_mbps = sys->mem_mbps,
                             .bound_l2 = (int16_t)topo_bound_cache(2),
                             .bound_l3 = (int16_t)topo_bound_cache(3),
                             .bell_fd = comm->progress.bell_fd[0],
                             .bell_ino = comm->progress.bell_ino,
                             .ctrl = comm->ctrl_addr};
  device_identity(comm->cuda_dev, &mine->cuda_uuid, &mine->cuda_view);
}

/* The host's topology, and the network's devices where only its run time
 * knows them (a net plugin's), as NCCL's topology lists its NICs. */
static void comm_log_topology(const struct ncclComm* comm, const struct topo_system* sys) {
  char net[1024];
  topo_log_summary(sys);
  if (debug_enabled(DEBUG_INFO, TOPO_LOG_SUB) &&
      transport_network_describe(&comm->tctx, net, sizeof(net)))
    INFO(TOPO_LOG_SUB, "Topology: %s", net);
}

/* Where Pairwise re-pairs ranks bound inside caches (sched_topo_place). */
static void comm_log_pairs(const struct ncclComm* comm) {
  const struct peer_info* me = &comm->peers[comm->rank];
  char text[256];
  size_t len = 0;
  for (int l = 0; l < SCHED_PAIR_LEVELS && len < sizeof(text); l++)
    if (comm->layout.pair_xor[l])
      len += (size_t)snprintf(text + len, sizeof(text) - len, " level %d: rank ^ %d", l,
                              comm->layout.pair_xor[l]);
  if (len > 0)
    INFO(SUB_INIT,
         "comm %p rank %d: bound inside the L2 of CPU %d, the L3 of CPU %d; "
         "deterministic partners%s",
         (void*)comm, comm->rank, me->bound_l2, me->bound_l3, text);
}

/* Nodes from the peers' host hashes, and which ranks are bound inside
 * one cache; the first rank of each node logs its topology. */
static ncclResult_t comm_layout(struct ncclComm* comm, const struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  uint64_t* hosts = NULL;
  int* caches = NULL; /* the ranks' L2s, then their L3s */
  CHECK(braid_calloc(&hosts, (size_t)comm->nranks, sizeof(*hosts)));
  CHECK(braid_calloc(&caches, 2 * (size_t)comm->nranks, sizeof(*caches)));
  for (int r = 0; r < comm->nranks; r++) hosts[r] = comm->peers[r].host_hash;
  CHECK(sched_topo_init(&comm->layout, comm->nranks, hosts));
  for (int r = 0; r < comm->nranks; r++) {
    caches[r] = comm->peers[r].bound_l2;
    caches[comm->nranks + r] = comm->peers[r].bound_l3;
  }
  sched_topo_place(&comm->layout, caches, caches + comm->nranks);
  const struct sched_topo* t = &comm->layout;
  int node = t->node_of[comm->rank];
  if (t->local_of[comm->rank] == 0) comm_log_topology(comm, sys);
  INFO(SUB_INIT, "comm %p rank %d: node %d of %d, local rank %d of %d", (void*)comm, comm->rank,
       node, t->nnodes, t->local_of[comm->rank], sched_topo_node_size(t, node));
  comm_log_pairs(comm);
fail:
  free(caches);
  free(hosts);
  return res;
}

/* Meet the other ranks through the bootstrap root: everyone's peer info. */
static ncclResult_t comm_bootstrap(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  const struct topo_system* sys = NULL;
  union socket_addr addr;
  char ifname[64] = "";
  struct peer_info mine;
  struct bootstrap_root* root = NULL;
  debug_set_device(comm->rank);
  CHECK(topo_system_get(&sys));
  CHECK(socket_local_addr(&addr, ifname, sizeof(ifname)));
  comm_describe_self(comm, sys, ifname, &mine);
  CHECK(transport_blobs_make(&comm->tctx, &mine));
  CHECK(
      bootstrap_maybe_start_root(&comm->ids.mine, comm->rank, comm->nranks, &comm->aborted, &root));
  res = bootstrap_exchange(&comm->ids, comm->rank, comm->nranks, &mine, comm->peers,
                           &comm->tctx.secret, comm->ctrl_fd, socket_deadline(param_timeout_ms()),
                           &comm->aborted, NULL);
  bootstrap_root_release(root); /* done serving, or its rank failed: it fails the others */
  CHECK(res);
  CHECK(comm_layout(comm, sys));
  CHECK(tuner_model_init(comm));
  if (comm->internal_stream) /* this thread is the comm's progress thread */
    CHECK(topo_bind_thread_near(sys, ifname, NULL));
  tuner_log_table(comm);
  flight_set_comm(&comm->flight, comm->rank, comm->nranks, comm->tctx.secret);
  status_register(comm); /* its control listener is served from now on */
  atomic_store(&comm->init_done, 1);
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Init COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
fail:
  return res;
}

/* A non-blocking comm's init runs as the first job of its stream. */
static ncclResult_t comm_bootstrap_job(void* p) {
  struct ncclComm* comm = p;
  ncclResult_t res = comm_bootstrap(comm);
  comm_set_error(comm, res);
  return res;
}

static ncclResult_t comm_init_rank(ncclComm_t* out, int nranks, const struct bootstrap_ids* ids,
                                   int rank, int cuda_dev, const ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = NULL;
  if (out == NULL) FAIL(ncclInvalidArgument, "ncclCommInitRank : comm pointer is NULL");
  *out = NULL;
  CHECK(comm_create(&comm, nranks, ids, rank, cuda_dev, config));
  if (comm->config.blocking == 0) {
    CHECK(stream_create(&comm->internal_stream));
    CHECK(stream_submit_fn(comm->internal_stream, comm_bootstrap_job, comm));
    *out = comm;
    return ncclInProgress;
  }
  CHECK(comm_bootstrap(comm));
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
  struct bootstrap_ids ids;
  ncclConfig_t config;
};

static ncclResult_t deferred_init_run(void* p) {
  struct deferred_init* d = p;
  ncclResult_t res = comm_init_rank(d->out, d->nranks, &d->ids, d->rank, d->cuda_dev,
                                    d->has_config ? &d->config : NULL);
  free(d);
  return res;
}

/* As NCCL: a comm is on the caller's current device, read here on the
 * caller's thread (a grouped init runs on another); -1 without CUDA. */
static int caller_device(void) {
  return device_current();
}

/* The ids for `rank`, checked with nranks and rank (ncclCommInitRank's
 * one id, or ncclCommInitRankScalable's nids). */
static ncclResult_t init_ids(const ncclUniqueId* ids, int nids, int nranks, int rank,
                             struct bootstrap_ids* out) {
  ncclResult_t res = ncclSuccess;
  if (nranks < 1 || nranks > BOOTSTRAP_MAX_RANKS)
    FAIL(ncclInvalidArgument, "ncclCommInitRank : invalid nranks %d", nranks);
  if (rank < 0 || rank >= nranks)
    FAIL(ncclInvalidArgument, "ncclCommInitRank : rank %d out of range [0,%d)", rank, nranks);
  CHECK(bootstrap_ids_pick(ids, nids, rank, nranks, out));
fail:
  return res;
}

static ncclResult_t init_rank_maybe_deferred(ncclComm_t* out, int nranks, const ncclUniqueId* uids,
                                             int nids, int rank, const ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct deferred_init* d = NULL;
  struct bootstrap_ids ids;
  int dev = caller_device();
  CHECK(init_ids(uids, nids, nranks, rank, &ids));
  device_kernels_preload(); /* here, on the caller's thread and context */
  if (group_depth() == 0) return comm_init_rank(out, nranks, &ids, rank, dev, config);
  CHECK(braid_calloc(&d, 1, sizeof(*d)));
  *d = (struct deferred_init){out, nranks, rank, dev, config != NULL, ids, NCCL_CONFIG_INITIALIZER};
  if (config) CHECK(comm_config_read(config, &d->config));
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
  return init_rank_maybe_deferred(comm, nranks, &commId, 1, rank, NULL);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return init_rank_maybe_deferred(comm, nranks, &commId, 1, rank, config);
}

struct init_all_arg {
  ncclComm_t* out;
  int ndev, rank, dev;
  const ncclUniqueId* id;
  ncclResult_t result;
  pthread_t thread; /* valid only when started: pthread_t has no "none" value */
  int started;
};

static void* init_all_main(void* p) {
  struct init_all_arg* a = p;
  struct bootstrap_ids ids;
  a->result = init_ids(a->id, 1, a->ndev, a->rank, &ids);
  if (a->result == ncclSuccess)
    a->result = comm_init_rank(a->out, a->ndev, &ids, a->rank, a->dev, NULL);
  return NULL;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ncclResult_t res = ncclSuccess;
  struct init_all_arg* args = NULL;
  ncclUniqueId id;
  if (comms == NULL) FAIL(ncclInvalidArgument, "ncclCommInitAll : comms is NULL");
  if (ndev < 1) FAIL(ncclInvalidArgument, "ncclCommInitAll : invalid ndev %d", ndev);
  CHECK(ncclGetUniqueId(&id));
  CHECK(braid_calloc(&args, (size_t)ndev, sizeof(*args)));
  for (int i = 0; i < ndev; i++) {
    args[i] = (struct init_all_arg){
        .out = &comms[i], .ndev = ndev, .rank = i, .dev = devlist ? devlist[i] : i, .id = &id};
    args[i].started = pthread_create(&args[i].thread, NULL, init_all_main, &args[i]) == 0;
    if (!args[i].started) FAIL(ncclSystemError, "ncclCommInitAll : cannot create thread %d", i);
  }
fail:
  for (int i = 0; args && i < ndev; i++) {
    if (args[i].started) pthread_join(args[i].thread, NULL);
    if (res == ncclSuccess) res = args[i].result;
  }
  if (res != ncclSuccess && comms && args)
    for (int i = 0; i < ndev; i++)
      if (args[i].started && args[i].result == ncclSuccess && comms[i])
        ncclCommDestroy(comms[i]), comms[i] = NULL;
  free(args);
  return res;
}

/* Each id's root registers one block of ranks (bootstrap_relay.h) and the
 * others hand theirs to the first: nId roots share the hellos. */
NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank,
         int nId, ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  if (nId < 1 || commIds == NULL)
    FAIL(ncclInvalidArgument, "ncclCommInitRankScalable : nId %d commIds %p", nId, (void*)commIds);
  return init_rank_maybe_deferred(newcomm, nranks, commIds, nId, myrank, config);
fail:
  return res;
}
