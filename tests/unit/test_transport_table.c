/*
 * The transport table (transports/transport_table.c): which transport
 * joins a pair of ranks, from the peer table alone; NCCL_NET steering
 * the network; the per-peer choice made once; registering a range with
 * the transports that have a reg hook, all or none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "param.h"
#include "shm/shm_names.h"
#include "transport.h"
#include "transport_table.h"
#ifdef BRAID_HAVE_CUDA
#include "cudaipc/cudaipc.h"
#endif

#define NPEERS 5
#define HOST_A 0xa11ull
#define HOST_B 0xb22ull
#define DOMAIN 0xd0d0ull

/* Ranks 0, 1 on host A sharing memory; 2 on host B; 3 on host A with
 * NCCL_SHM_DISABLE (no domain); 4 on host A in another container. */
static struct peer_info g_peers[NPEERS];
static const struct transport* g_chosen[NPEERS];

static struct shm_blob* shm_of(int r) {
  return transport_blob_put(&g_peers[r], &shm_transport);
}

static void table_ctx(struct transport_ctx* ctx, int rank) {
  static const uint64_t hosts[NPEERS] = {HOST_A, HOST_A, HOST_B, HOST_A, HOST_A};
  static const uint64_t domains[NPEERS] = {DOMAIN, DOMAIN, DOMAIN, 0, DOMAIN + 1};
  for (int r = 0; r < NPEERS; r++) {
    g_peers[r] = (struct peer_info){.rank = r, .host_hash = hosts[r]};
    shm_of(r)->domain = domains[r];
  }
  memset(g_chosen, 0, sizeof(g_chosen));
  memset(ctx, 0, sizeof(*ctx));
  ctx->rank = rank;
  ctx->nranks = NPEERS;
  ctx->peers = g_peers;
  ctx->chosen = g_chosen;
}

/* A peer's blobs are records (id, length, bytes): each transport finds its
 * own wherever it lies, and reads zeros where the peer has none, or where
 * a record's length is not its blob's or runs past the table: a peer's
 * bytes are never read out of bounds. */
static void test_blob_records(void** state) {
  struct transport_ctx ctx = {.rank = 0, .nranks = 1, .peers = g_peers};
  static const uint8_t zeros[64];
  (void)state;
  memset(&g_peers[0], 0, sizeof(g_peers[0]));
  assert_memory_equal(transport_peer_blob(&ctx, &tcp_transport, 0), zeros,
                      tcp_transport.blob_bytes);
  uint8_t* tcp = transport_blob_put(&g_peers[0], &tcp_transport);
  uint8_t* shm = transport_blob_put(&g_peers[0], &shm_transport);
  assert_non_null(tcp);
  assert_non_null(shm);
  memset(tcp, 0x7c, tcp_transport.blob_bytes);
  memset(shm, 0x5a, shm_transport.blob_bytes);
  assert_ptr_equal(transport_blob_put(&g_peers[0], &tcp_transport), tcp); /* found, not made */
  assert_ptr_equal(transport_peer_blob(&ctx, &tcp_transport, 0), tcp);
  assert_ptr_equal(transport_peer_blob(&ctx, &shm_transport, 0), shm);
  uint8_t* b = g_peers[0].blobs;
  b[1] = (uint8_t)(tcp_transport.blob_bytes + 1); /* tcp's record claims another length */
  assert_memory_equal(transport_peer_blob(&ctx, &tcp_transport, 0), zeros,
                      tcp_transport.blob_bytes);
  b[1] = 250; /* past the table: nothing after it is read */
  assert_memory_equal(transport_peer_blob(&ctx, &shm_transport, 0), zeros,
                      shm_transport.blob_bytes);
  memset(b, 0xff, PEER_BLOB_BYTES); /* all records of an unknown id, lengths past the end */
  assert_memory_equal(transport_peer_blob(&ctx, &shm_transport, 0), zeros,
                      shm_transport.blob_bytes);
  assert_null(transport_blob_put(&g_peers[0], &shm_transport)); /* no room */
}

/* Each descriptor's key names it in status dumps, and back. */
static void test_keys(void** state) {
  (void)state;
  assert_string_equal(transport_key_of(tcp_transport.id), "tcp");
  assert_string_equal(transport_key_of(shm_transport.id), "shm");
  assert_int_equal(transport_id_of("tcp"), (int)tcp_transport.id);
  assert_int_equal(transport_id_of("nope"), -1);
  assert_null(transport_key_of(TRANSPORT_MAX_ID));
}

static void test_pairs(void** state) {
  (void)state;
  struct transport_ctx ctx;
  unsetenv("NCCL_NET");
  table_ctx(&ctx, 0);
  assert_int_equal(transport_table_init(&ctx), ncclSuccess);
  assert_ptr_equal(transport_select(&ctx, 0, 1, TRANSPORT_CAP_HOST_MEM), &shm_transport);
  assert_ptr_equal(transport_select(&ctx, 1, 0, TRANSPORT_CAP_HOST_MEM), &shm_transport);
  assert_ptr_equal(transport_select(&ctx, 0, 2, TRANSPORT_CAP_HOST_MEM), &tcp_transport);
  assert_ptr_equal(transport_select(&ctx, 0, 3, TRANSPORT_CAP_HOST_MEM), &tcp_transport);
  assert_ptr_equal(transport_select(&ctx, 3, 0, TRANSPORT_CAP_HOST_MEM), &tcp_transport);
  assert_ptr_equal(transport_select(&ctx, 0, 4, TRANSPORT_CAP_HOST_MEM), &tcp_transport);
  /* device memory: nothing in this build moves it */
  assert_null(transport_select(&ctx, 0, 1, TRANSPORT_CAP_DEVICE_MEM));
  assert_ptr_equal(transport_network(&ctx), &tcp_transport);
}

/* The choice is made once per peer and kept, whatever the table says later. */
static void test_chosen_once(void** state) {
  (void)state;
  struct transport_ctx ctx;
  const struct transport* t = NULL;
  unsetenv("NCCL_NET");
  table_ctx(&ctx, 1);
  assert_int_equal(transport_table_init(&ctx), ncclSuccess);
  assert_int_equal(transport_for_peer(&ctx, 0, &t), ncclSuccess);
  assert_ptr_equal(t, &shm_transport);
  assert_ptr_equal(g_chosen[0], &shm_transport);
  shm_of(0)->domain = 0; /* would now choose sockets: the kept choice wins */
  assert_int_equal(transport_for_peer(&ctx, 0, &t), ncclSuccess);
  assert_ptr_equal(t, &shm_transport);
  assert_int_equal(transport_for_peer(&ctx, 2, &t), ncclSuccess);
  assert_ptr_equal(t, &tcp_transport);
}

static void test_net_knob(void** state) {
  (void)state;
  struct transport_ctx ctx;
  table_ctx(&ctx, 0);
  setenv("NCCL_NET", "socket", 1); /* NCCL compares without case */
  param_cache_reset();             /* parameters are read once per process */
  assert_int_equal(transport_table_init(&ctx), ncclSuccess);
  assert_ptr_equal(transport_select(&ctx, 0, 2, TRANSPORT_CAP_HOST_MEM), &tcp_transport);
  setenv("NCCL_NET", "Carrier-Pigeon", 1); /* no such network */
  param_cache_reset();
  assert_int_equal(transport_table_init(&ctx), ncclInvalidArgument);
#ifdef BRAID_HAVE_IBVERBS
  setenv("NCCL_NET", "IB", 1); /* known, but no verbs transport yet (test_ib_probe has why) */
  param_cache_reset();
  assert_int_equal(transport_table_init(&ctx), ncclInvalidUsage);
#endif
  unsetenv("NCCL_NET");
  param_cache_reset();
}

/* A buffer of a kind the transport does not move is refused at post. */
static void test_memory_kinds(void** state) {
  (void)state;
  struct transport_conn c = {.ops = &shm_transport, .peer = 1};
  struct transport_buf host = {NULL, 8, TRANSPORT_CAP_HOST_MEM, NULL, NULL, 0, 0, 0};
  struct transport_buf device = {NULL, 8, TRANSPORT_CAP_DEVICE_MEM, NULL, NULL, 0, 0, 0};
  struct transport_buf none = {NULL, 8, 0, NULL, NULL, 0, 0, 0};
  assert_true(transport_moves(&c, &host));
  assert_false(transport_moves(&c, &device));
  assert_false(transport_moves(&c, &none));
  c.ops = &tcp_transport;
  assert_true(transport_moves(&c, &host));
  assert_false(transport_moves(&c, &device));
}

#ifdef BRAID_HAVE_CUDA
/* Device buffers: CUDA IPC joins ranks of one host whose devices are known
 * (the same device here: no driver is asked), both taking part; the other
 * pairs have no device transport, and host buffers never take CUDA IPC. */
static void test_device_pairs(void** state) {
  (void)state;
  static const uint64_t uuids[NPEERS] = {0x1111, 0x1111, 0x1111, 0x1111, 0};
  const struct transport* chosen_dev[NPEERS] = {0};
  struct transport_device dev = {0};
  struct transport_ctx ctx;
  unsetenv("NCCL_NET");
  table_ctx(&ctx, 0);
  ctx.chosen_device = chosen_dev;
  unsetenv("NCCL_P2P_DISABLE");
  param_cache_reset();
  for (int r = 0; r < NPEERS; r++) {
    if (r == 3) { /* rank 3 turns CUDA IPC off */
      setenv("NCCL_P2P_DISABLE", "1", 1);
      param_cache_reset();
    }
    g_peers[r].cuda_uuid = g_peers[r].cuda_view = uuids[r];
    cudaipc_transport.blob_make(&ctx, transport_blob_put(&g_peers[r], &cudaipc_transport));
  }
  unsetenv("NCCL_P2P_DISABLE");
  param_cache_reset();
  assert_int_equal(transport_table_init(&ctx), ncclSuccess);
  assert_ptr_equal(transport_select(&ctx, 0, 1, TRANSPORT_CAP_DEVICE_MEM), &cudaipc_transport);
  assert_ptr_equal(transport_select(&ctx, 1, 0, TRANSPORT_CAP_DEVICE_MEM), &cudaipc_transport);
  assert_null(transport_select(&ctx, 0, 2, TRANSPORT_CAP_DEVICE_MEM)); /* another host */
  assert_null(transport_select(&ctx, 0, 3, TRANSPORT_CAP_DEVICE_MEM)); /* NCCL_P2P_DISABLE */
  assert_null(transport_select(&ctx, 3, 0, TRANSPORT_CAP_DEVICE_MEM));
  assert_null(transport_select(&ctx, 0, 4, TRANSPORT_CAP_DEVICE_MEM)); /* no device */
  assert_null(transport_select(&ctx, 0, 0, TRANSPORT_CAP_DEVICE_MEM)); /* itself */
  assert_ptr_equal(transport_select(&ctx, 0, 1, TRANSPORT_CAP_HOST_MEM), &shm_transport);
  /* the per-peer choice waits for the comm's device, then is made once */
  assert_null(transport_for_peer_device(&ctx, 1));
  assert_null(chosen_dev[1]);
  ctx.device = &dev;
  assert_ptr_equal(transport_for_peer_device(&ctx, 1), &cudaipc_transport);
  assert_null(transport_for_peer_device(&ctx, 2));
  assert_ptr_equal(chosen_dev[2], &transport_none);
  assert_ptr_equal(chosen_dev[1], &cudaipc_transport);
}
#endif

/* ---- Registration: two transports that pin memory, one without ---- */

static int g_reg_calls, g_dereg_calls, g_fail_second;
static char g_handle_a, g_handle_b;

static ncclResult_t reg_a(struct transport_ctx* ctx, void* base, size_t size, void** handle) {
  (void)ctx, (void)base, (void)size;
  g_reg_calls++;
  *handle = &g_handle_a;
  return ncclSuccess;
}

static ncclResult_t reg_b(struct transport_ctx* ctx, void* base, size_t size, void** handle) {
  (void)ctx, (void)base, (void)size;
  g_reg_calls++;
  if (g_fail_second) return ncclSystemError;
  *handle = &g_handle_b;
  return ncclSuccess;
}

static void dereg_any(struct transport_ctx* ctx, void* handle) {
  (void)ctx;
  assert_true(handle == &g_handle_a || handle == &g_handle_b);
  g_dereg_calls++;
}

static void test_register_each(void** state) {
  (void)state;
  const struct transport pin_a = {.name = "pinA", .id = 0, .reg = reg_a, .dereg = dereg_any};
  const struct transport plain = {.name = "plain", .id = 1};
  const struct transport pin_b = {.name = "pinB", .id = 2, .reg = reg_b, .dereg = dereg_any};
  const struct transport* const list[] = {&pin_a, &plain, &pin_b};
  struct transport_ctx ctx = {0};
  void* handles[3] = {0};
  char buf[64];
  g_reg_calls = g_dereg_calls = g_fail_second = 0;
  assert_int_equal(transport_register_each(list, 3, &ctx, buf, sizeof(buf), handles), ncclSuccess);
  assert_ptr_equal(handles[0], &g_handle_a);
  assert_null(handles[1]); /* nothing to pin: no hook, no handle */
  assert_ptr_equal(handles[2], &g_handle_b);
  transport_deregister_each(list, 3, &ctx, handles);
  assert_int_equal(g_dereg_calls, 2);
  assert_true(handles[0] == NULL && handles[2] == NULL);

  /* The second pin fails: the first is undone, the error comes back. */
  g_reg_calls = g_dereg_calls = 0;
  g_fail_second = 1;
  assert_int_equal(transport_register_each(list, 3, &ctx, buf, sizeof(buf), handles),
                   ncclSystemError);
  assert_int_equal(g_reg_calls, 2);
  assert_int_equal(g_dereg_calls, 1);
  assert_true(handles[0] == NULL && handles[1] == NULL && handles[2] == NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pairs),         cmocka_unit_test(test_chosen_once),
      cmocka_unit_test(test_net_knob),      cmocka_unit_test(test_memory_kinds),
      cmocka_unit_test(test_register_each), cmocka_unit_test(test_blob_records),
      cmocka_unit_test(test_keys),
#ifdef BRAID_HAVE_CUDA
      cmocka_unit_test(test_device_pairs),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
