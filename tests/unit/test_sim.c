/*
 * braid-sim's model, checked against what can be worked out by hand: one
 * message over a port, a bandwidth-bound ring at the NIC's rate, symmetric
 * play against full play, extrapolation against exact play, and schedules
 * that do not match reported, not hung.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "sched_build.h"
#include "schedule.h"
#include "sim_cluster.h"
#include "sim_engine.h"
#include "sim_net.h"
#include "sim_run.h"
#include "transport.h"
#include "tune/tuner.h"
#include "tune/tuner_model.h"
#include "sched_algos.h"

/* perf/sim_calibrate.py's fit for the emulated 1 Gbit/s cluster (perf/sim_tables.sh's
 * CALIBRATED) */
#define SIM_FIT_LAT "4"
#define SIM_FIT_MSG "2.5"
#define SIM_FIT_INTRA_MSG "1.5"

static void cluster(struct sim_cluster* c, int nranks, int per_node) {
  sim_cluster_defaults(c);
  c->nranks = nranks, c->per_node = per_node;
  assert_int_equal(sim_cluster_check(c), ncclSuccess);
}

static double simulate(struct sim_cluster* c, int coll, int algo, size_t bytes, unsigned flags,
                       struct sim_result* r) {
  struct sim_context s;
  struct sim_call call = {.coll = coll, .algo = algo, .root = 0, .bytes = bytes};
  assert_int_equal(sim_context_init(&s, c), ncclSuccess);
  assert_int_equal(sim_collective(&s, &call, flags, r), ncclSuccess);
  sim_context_free(&s);
  return r->us;
}

/* One message across nodes: bytes at the NIC's rate plus the latency;
 * a second offered at once waits for the first at the sender's port. */
static void test_one_message(void** state) {
  struct sim_cluster c;
  struct sim_net n;
  double sent, arrived, sent2, arrived2;
  (void)state;
  cluster(&c, 2, 1);
  c.nic_gbps = 8, c.net_lat_us = 3; /* 1000 bytes per us */
  assert_int_equal(sim_net_init(&n, &c, 2, 2), ncclSuccess);
  sim_net_send(&n, 0, 1, 0, 0, 1, 1, 1e6, 10.0, &sent, &arrived);
  assert_true(fabs(sent - 1010.0) < 1e-9);
  assert_true(fabs(arrived - 1013.0) < 1e-9);
  sim_net_send(&n, 0, 1, 0, 0, 1, 1, 1e6, 10.0, &sent2, &arrived2);
  assert_true(fabs(sent2 - 2010.0) < 1e-9);
  assert_true(fabs(arrived2 - 2013.0) < 1e-9);
  sim_net_free(&n);
}

/* A NIC behind a token bucket (tc's tbf): a message the bucket covers
 * passes at the wire's speed, then the link's rate rules; a loop of calls
 * (repeat) sees what the bucket has left, not a full one. */
static void test_token_bucket(void** state) {
  struct sim_cluster c;
  struct sim_net n;
  struct sim_result once, loop, plain;
  double sent, arrived;
  (void)state;
  cluster(&c, 2, 1);
  c.nic_gbps = 8, c.wire_gbps = 80, c.net_lat_us = 0, c.burst_bytes = 100000;
  assert_int_equal(sim_net_init(&n, &c, 2, 2), ncclSuccess);
  sim_net_send(&n, 0, 1, 0, 0, 1, 1, 50000, 0, &sent, &arrived);
  assert_true(fabs(sent - 5.0) < 1e-9); /* 50 kB at 10 kB/us */
  sim_net_send(&n, 0, 1, 0, 0, 1, 1, 100000, sent, &sent, &arrived);
  /* 55 kB of tokens left: the other 45 kB at the rate, 1 kB/us */
  assert_true(fabs(sent - 5.0 - 45.0) < 1e-6);
  sim_net_free(&n);
  struct sim_call call = {.coll = COLL_ALLREDUCE, .algo = ALGO_RING, .bytes = 1 << 20};
  struct sim_context s;
  assert_int_equal(sim_context_init(&s, &c), ncclSuccess);
  assert_int_equal(sim_collective(&s, &call, 0, &once), ncclSuccess);
  call.repeat = 16;
  assert_int_equal(sim_collective(&s, &call, 0, &loop), ncclSuccess);
  sim_context_free(&s);
  c.burst_bytes = 0;
  simulate(&c, COLL_ALLREDUCE, ALGO_RING, 1 << 20, 0, &plain);
  print_message("1 MiB ring: %.1f us once, %.1f us a call in a loop, %.1f us unshaped bucket\n",
                once.us, loop.us, plain.us);
  assert_true(once.us < loop.us);
  assert_true(fabs(loop.us - plain.us) <= 0.05 * plain.us);
}

/* A big ring all-reduce over one rank per node is bound by the NIC: its
 * bus bandwidth comes within 10% of the line rate, never above it. */
static void test_ring_at_line_rate(void** state) {
  struct sim_cluster c;
  struct sim_result r;
  (void)state;
  cluster(&c, 8, 1);
  c.nic_gbps = 10;
  size_t bytes = (size_t)256 << 20;
  double us = simulate(&c, COLL_ALLREDUCE, ALGO_RING, bytes, 0, &r);
  double busbw_gbps = (double)bytes * 8 / (us * 1e3) * 2.0 * 7 / 8;
  assert_true(busbw_gbps <= 10.0);
  assert_true(busbw_gbps > 9.0);
}

/* Node 0's ranks standing for all give the time of every rank played,
 * to the last digit, for a shift (ring, Hier) and an xor (doubling,
 * Pairwise) symmetry: the engine uses every resource in time order, and
 * serves events of one instant in an order both plays agree on. Symmetric
 * play is taken only where every node's ranks also wait for the same
 * steps before a send (sim_step.y_wait): Hier's all-reduce from a round
 * of several slices has its nodes wait differently (the network ring
 * writes a block's parts in an order that turns with the node), and
 * plays in full. */
static void test_symmetric_matches_full(void** state) {
  static const struct {
    int coll, algo, always;
  } cases[] = {{COLL_ALLREDUCE, ALGO_RING, 1},     {COLL_ALLGATHER, ALGO_RING, 1},
               {COLL_REDUCESCATTER, ALGO_RING, 1}, {COLL_ALLREDUCE, ALGO_HIER, 0},
               {COLL_ALLREDUCE, ALGO_RD, 1},       {COLL_ALLREDUCE, ALGO_PAIRWISE, 1},
               {COLL_REDUCESCATTER, ALGO_HIER, 1}};
  struct sim_cluster c;
  (void)state;
  cluster(&c, 32, 4);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    for (size_t bytes = 64 << 10; bytes <= (8u << 20); bytes *= 8) {
      struct sim_result sym, full;
      simulate(&c, cases[i].coll, cases[i].algo, bytes, 0, &sym);
      simulate(&c, cases[i].coll, cases[i].algo, bytes, SIM_FULL, &full);
      print_message("%s %s %zu B: %s %.1f us, full %.1f us\n", sched_coll_name(cases[i].coll),
                    sched_algo_name(cases[i].algo), bytes, sym.symmetric ? "symmetric" : "full",
                    sym.us, full.us);
      assert_true(sym.symmetric || !cases[i].always);
      assert_false(full.symmetric);
      assert_true(fabs(sym.us - full.us) <= 1e-9 * full.us);
    }
}

/* A plain send of output bytes leaves only once the step that writes them
 * is computed, as in the executor (send_may_go): recursive halving's
 * rounds then follow one another, 8 network hops for 16 ranks, where a
 * send let go once posted finished them in the time of 4. */
static void test_send_waits_for_its_data(void** state) {
  struct sim_cluster c;
  struct sim_result r;
  (void)state;
  cluster(&c, 16, 1);
  double us = simulate(&c, COLL_ALLREDUCE, ALGO_RD, 32 << 10, SIM_FULL, &r);
  double hop = c.net_lat_us + 2 * c.msg_us;
  print_message("32 KiB halving over 16 ranks: %.1f us, 8 hops %.1f us\n", us, 8 * hop);
  assert_true(us >= 8 * hop);
}

/* Ranks sharing a host's cores (an emulated cluster on one machine): one
 * core does every message's CPU work in turn, so a call takes at least
 * their sum; as many cores as ranks never make one wait, the same time as
 * a core each; the kernel's copy of a message's bytes costs its rank. */
static void test_shared_cores(void** state) {
  static const int algos[] = {ALGO_RING, ALGO_TREE, ALGO_RD, ALGO_HIER};
  struct sim_cluster c;
  struct sim_result own, one, all, sock;
  (void)state;
  cluster(&c, 16, 2);
  c.msg_us = 10, c.intra_msg_us = 5, c.net_lat_us = 0;
  for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
    for (size_t bytes = 8; bytes <= (1u << 20); bytes *= 512) {
      c.host_cores = 0;
      simulate(&c, COLL_ALLREDUCE, algos[i], bytes, SIM_FULL, &own);
      c.host_cores = 1;
      simulate(&c, COLL_ALLREDUCE, algos[i], bytes, 0, &one);
      c.host_cores = c.nranks;
      simulate(&c, COLL_ALLREDUCE, algos[i], bytes, 0, &all);
      c.sock_gbps = 1; /* 8 ns a byte at each end of a network message */
      simulate(&c, COLL_ALLREDUCE, algos[i], bytes, 0, &sock);
      c.sock_gbps = 0;
      double floor = 2.0 * (double)one.messages * c.intra_msg_us; /* every message is >= 5 us */
      print_message("%s %zu B: a core each %.1f us, 1 core %.1f us (>= %.1f), %d cores %.1f us\n",
                    sched_algo_name(algos[i]), bytes, own.us, one.us, floor, c.nranks, all.us);
      assert_false(one.symmetric);
      assert_true(one.us >= floor);
      assert_true(one.us > own.us);
      assert_true(fabs(all.us - own.us) <= 1e-9 * own.us);
      assert_true(sock.us > all.us);
    }
}

static void test_tree_plays_in_full(void** state) {
  struct sim_cluster c;
  struct sim_result r;
  (void)state;
  cluster(&c, 32, 4);
  simulate(&c, COLL_ALLREDUCE, ALGO_TREE, 1 << 20, 0, &r);
  assert_false(r.symmetric);
  assert_true(r.us > 0);
}

/* Past the budget, a time from two smaller calls: within 2% of playing
 * the call itself. */
static void test_extrapolation(void** state) {
  struct sim_cluster c;
  struct sim_context s;
  struct sim_result exact, guess;
  struct sim_call call = {.coll = COLL_ALLREDUCE, .algo = ALGO_TREE, .bytes = (size_t)32 << 20};
  (void)state;
  cluster(&c, 64, 8);
  assert_int_equal(sim_context_init(&s, &c), ncclSuccess);
  assert_int_equal(sim_collective(&s, &call, SIM_EXACT, &exact), ncclSuccess);
  s.step_budget = 64 * 400; /* exact play needs ~64 x 2k steps */
  assert_int_equal(sim_collective(&s, &call, 0, &guess), ncclSuccess);
  sim_context_free(&s);
  print_message("tree 32 MiB on 64 ranks: %.1f us played, %.1f us extrapolated\n", exact.us,
                guess.us);
  assert_false(exact.extrapolated);
  assert_true(guess.extrapolated);
  assert_true(fabs(guess.us - exact.us) <= 0.02 * exact.us);
}

/* The emulated cluster's figures as perf/sim_calibrate.py fitted them
 * (docs/simulator.md, "Calibration"), its links at iperf3's rate; at
 * scale without tc's bucket. */
static void calibrated(struct sim_cluster* c, int nranks, int per_node) {
  cluster(c, nranks, per_node);
  assert_int_equal(sim_cluster_set(c, "nic_gbps=0.952"), ncclSuccess);
  assert_int_equal(sim_cluster_set(c, "net_lat_us=" SIM_FIT_LAT), ncclSuccess);
  assert_int_equal(sim_cluster_set(c, "msg_us=" SIM_FIT_MSG), ncclSuccess);
  assert_int_equal(sim_cluster_set(c, "intra_msg_us=" SIM_FIT_INTRA_MSG), ncclSuccess);
}

/* A line through smaller calls never gives a call less time than its
 * nodes' NICs need for it: at 2,048 ranks, 2 a node, Hier's smaller
 * 16 MiB all-reduces drew a line to 1.7 times the line rate; now the
 * call is too big to play, or slower than the wire allows. */
static void test_extrapolation_floor(void** state) {
  struct sim_cluster c;
  struct sim_result r;
  (void)state;
  calibrated(&c, 2048, 2);
  size_t bytes = (size_t)16 << 20;
  double m = c.nranks / c.per_node, floor_us = bytes * 2 * (m - 1) / m / (c.nic_gbps * 125.0);
  simulate(&c, COLL_ALLREDUCE, ALGO_HIER, bytes, 0, &r);
  print_message("Hier 16 MiB on 2048 ranks: %s %.1f us, the wire's floor %.1f us\n",
                r.too_big ? "too big" : "played", r.us, floor_us);
  assert_true(r.too_big || r.us >= floor_us);
}

/* A line through calls of another shape is no answer: over 512 nodes of
 * 8 Hier runs a 16 MiB all-reduce in several unpipelined rounds, each
 * paying its network ring's 2 x 511 hops, and the line through its
 * one-round calls gave it 13.5 ms, under what those hops alone take. */
static void test_extrapolation_shape(void** state) {
  struct sim_cluster c;
  struct sim_result r;
  (void)state;
  cluster(&c, 4096, 8);
  double hop_us = c.net_lat_us + 2 * c.msg_us, two_rounds_us = 2 * (2 * 511) * hop_us;
  simulate(&c, COLL_ALLREDUCE, ALGO_HIER, (size_t)16 << 20, 0, &r);
  print_message("Hier 16 MiB on 4096 ranks: %s %.1f us, two rounds' hops %.1f us\n",
                r.too_big ? "too big" : "played", r.us, two_rounds_us);
  assert_true(r.too_big || r.us >= two_rounds_us);
}

/* A cluster of the tuner grid: the calibrated 1 Gbit/s one at 2 or 8
 * ranks a node, or braid-sim's 100 Gbit/s default at 8. */
struct grid_cluster {
  const char* name;
  int per_node, calibrated;
};

/* The worst pick/best ratio of the library's tuner over one cluster's
 * grid, its links priced from the cluster's figures (tune_links=1: what
 * a BRAID_TUNE_FILE written for it says). */
static double tuner_grid_worst(const struct grid_cluster* g) {
  static const int ranks[] = {64, 512, 4096, 16384};
  static const size_t sizes[] = {8, 64, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 128 << 20};
  unsigned eligible = tuner_allowed();
  double worst = 1;
  for (size_t n = 0; n < sizeof(ranks) / sizeof(ranks[0]); n++) {
    struct sim_cluster c;
    struct sim_context s;
    if (g->calibrated)
      calibrated(&c, ranks[n], g->per_node);
    else
      cluster(&c, ranks[n], g->per_node);
    assert_int_equal(sim_cluster_set(&c, "tune_links=1"), ncclSuccess);
    assert_int_equal(sim_context_init(&s, &c), ncclSuccess);
    for (size_t b = 0; b < sizeof(sizes) / sizeof(sizes[0]); b++) {
      double t[ALGO_COUNT] = {0}, best = 0;
      int pick = sim_tuner_pick(&s, COLL_ALLREDUCE, sizes[b]);
      for (int a = 0; a < ALGO_COUNT; a++) {
        struct sim_call call = {.coll = COLL_ALLREDUCE, .algo = a, .bytes = sizes[b]};
        struct sim_result r;
        if (!(eligible & (1u << a)) || !sched_supports_on(&s.topo, COLL_ALLREDUCE, a)) continue;
        assert_int_equal(sim_collective(&s, &call, 0, &r), ncclSuccess);
        t[a] = r.us;
        if (r.us >= 0 && (best == 0 || r.us < best)) best = r.us;
      }
      print_message("%s %5d ranks %10zu B: %s %.1f us, best %.1f us (%.2fx)\n", g->name, ranks[n],
                    sizes[b], sched_algo_name(pick), t[pick], best, t[pick] / best);
      if (t[pick] < 0) continue; /* too big to play: no time to judge it by */
      worst = MAX(worst, t[pick] / best);
    }
    sim_context_free(&s);
  }
  return worst;
}

/* The library's tuner at scale: at every point of the grid, on each
 * cluster, its pick takes at most 1.1x the best algorithm it chooses
 * among (NCCL_ALGO's default set). */
static void test_tuner_at_scale(void** state) {
  static const struct grid_cluster clusters[] = {
      {"1gbit x2", 2, 1}, {"1gbit x8", 8, 1}, {"100gbit x8", 8, 0}};
  (void)state;
  for (size_t i = 0; i < sizeof(clusters) / sizeof(clusters[0]); i++)
    assert_true(tuner_grid_worst(&clusters[i]) <= 1.1);
}

/* Hier's leaders cross the network one a node: the tuner prices their
 * rounds with a lone rank's hop (net_alone), where a flat algorithm's
 * ranks cross together and share the cores (net). On 2 hosts of 4 ranks,
 * 2 cores each, the crowded hop put recursive doubling under Hier up to
 * 1 KiB, where Hier took 0.55x its time on the emulated cluster. */
static void test_leaders_cross_alone(void** state) {
  struct tuner_model m = {.nranks = 8,
                          .nnodes = 2,
                          .min_ppn = 4,
                          .max_ppn = 4,
                          .tree_depth = 4,
                          .slot_bytes = 65536,
                          .slices_per_step = 8,
                          .tree_sharers = 1,
                          .intra_transport = &shm_transport,
                          .net_transport = &tcp_transport,
                          .oversub = 2,
                          .nic_mbps = 1000,
                          .mem_mbps = 5000};
  (void)state;
  tuner_model_price(&m);
  assert_true(m.net_alone.alpha_us[ALGO_RD] < m.net.alpha_us[ALGO_RD]);
  double hier = tuner_cost(&m, COLL_ALLREDUCE, ALGO_HIER, 256);
  double rd = tuner_cost(&m, COLL_ALLREDUCE, ALGO_RD, 256);
  m.net_alone = m.net; /* leaders priced as crowded */
  assert_true(tuner_cost(&m, COLL_ALLREDUCE, ALGO_HIER, 256) > hier);
  assert_true(tuner_cost(&m, COLL_ALLREDUCE, ALGO_RD, 256) == rd);
}

/* A rank that waits for a message nobody sends: an error naming it. */
static void test_unmatched_schedules(void** state) {
  struct sim_cluster c;
  struct sim_step r0[] = {{.recv = -1, .send = 1, .bytes = 64, .prim = PRIM_SEND}};
  struct sim_step r1[] = {{.recv = 0, .send = -1, .bytes = 64, .prim = PRIM_RECV},
                          {.recv = 0, .send = -1, .bytes = 64, .prim = PRIM_RECV}};
  struct sim_step* steps[] = {r0, r1};
  size_t nsteps[] = {1, 2};
  struct sim_stats st;
  (void)state;
  cluster(&c, 2, 1);
  struct sim_plan p = {.c = &c, .nsim = 2, .steps = steps, .nsteps = nsteps};
  assert_int_equal(sim_play(&p, &st), ncclInternalError);
  nsteps[1] = 1;
  assert_int_equal(sim_play(&p, &st), ncclSuccess);
  assert_int_equal(st.messages, 1);
}

/* Bad settings are refused with a message, not taken. */
static void test_cluster_settings(void** state) {
  struct sim_cluster c;
  (void)state;
  sim_cluster_defaults(&c);
  assert_int_equal(sim_cluster_set(&c, "nic_gbps=200"), ncclSuccess);
  assert_true(c.nic_gbps == 200);
  assert_int_equal(sim_cluster_set(&c, "fabric=rails"), ncclSuccess);
  assert_int_equal(sim_cluster_set(&c, "nic_gbps=fast"), ncclInvalidArgument);
  assert_int_equal(sim_cluster_set(&c, "no_such=1"), ncclInvalidArgument);
  assert_int_equal(sim_cluster_set(&c, "fabric=torus"), ncclInvalidArgument);
  c.nranks = 10, c.per_node = 4;
  assert_int_equal(sim_cluster_check(&c), ncclInvalidArgument);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_message),
      cmocka_unit_test(test_token_bucket),
      cmocka_unit_test(test_ring_at_line_rate),
      cmocka_unit_test(test_symmetric_matches_full),
      cmocka_unit_test(test_send_waits_for_its_data),
      cmocka_unit_test(test_shared_cores),
      cmocka_unit_test(test_tree_plays_in_full),
      cmocka_unit_test(test_extrapolation),
      cmocka_unit_test(test_extrapolation_floor),
      cmocka_unit_test(test_extrapolation_shape),
      cmocka_unit_test(test_leaders_cross_alone),
      cmocka_unit_test(test_unmatched_schedules),
      cmocka_unit_test(test_cluster_settings),
      cmocka_unit_test(test_tuner_at_scale),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
