/*
 * The memory module: every buffer is host memory for now, mem_copy keeps
 * memmove's rule, the registration cache finds the registration that
 * covers a range (what transports that map or pin memory will ask), its
 * hooks attach and detach every registration exactly once, and the
 * descriptor a transport gets carries the handle of a covering one.
 * ncclMemFree takes back only what ncclMemAlloc gave, once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine/mem.h"

static void test_query_and_copy(void** state) {
  (void)state;
  char buf[32] = "abcdefghijklmnopqrstuvwxyz";
  int on_stack;
  assert_int_equal(mem_query(buf), MEM_HOST);
  assert_int_equal(mem_query(&on_stack), MEM_HOST);
  assert_string_equal(mem_kind_name(MEM_DEVICE), "device");
  assert_int_equal(mem_copy(buf + 2, buf, 10), ncclSuccess); /* overlapping, forward */
  assert_memory_equal(buf, "ababcdefghijmnop", 16);
  assert_int_equal(mem_copy(buf, buf + 2, 10), ncclSuccess); /* and backward */
  assert_memory_equal(buf, "abcdefghijijmnop", 16);
  assert_int_equal(mem_copy(buf, buf, 0), ncclSuccess);
}

static void test_registrations(void** state) {
  (void)state;
  static char mem[4096];
  struct mem_regs regs;
  struct mem_reg *a = NULL, *b = NULL;
  mem_regs_init(&regs, NULL);
  assert_null(mem_reg_find(&regs, mem, 1));
  assert_int_equal(mem_reg_add(&regs, mem, 1024, &a), ncclSuccess);
  assert_int_equal(mem_reg_add(&regs, mem + 2048, 1024, &b), ncclSuccess);
  assert_ptr_equal(mem_reg_find(&regs, mem, 1024), a);
  assert_ptr_equal(mem_reg_find(&regs, mem + 100, 10), a);
  assert_ptr_equal(mem_reg_find(&regs, mem + 3000, 72), b);
  assert_null(mem_reg_find(&regs, mem + 1000, 100));  /* runs past a's end */
  assert_null(mem_reg_find(&regs, mem + 1500, 10));   /* between them */
  assert_null(mem_reg_find(&regs, mem + 2000, 1024)); /* starts before b */
  assert_int_equal(mem_reg_remove(&regs, a), ncclSuccess);
  assert_null(mem_reg_find(&regs, mem + 100, 10));
  assert_int_equal(mem_reg_remove(&regs, a), ncclInvalidArgument); /* gone already */
  mem_regs_free(&regs); /* b still registered: freed here */
}

struct hook_log {
  int attached, detached, fail_next;
};

static ncclResult_t log_attach(void* arg, struct mem_reg* reg) {
  struct hook_log* log = arg;
  if (log->fail_next) return ncclSystemError;
  log->attached++;
  reg->handles[1] = reg; /* what transport id 1 would keep */
  return ncclSuccess;
}

static void log_detach(void* arg, struct mem_reg* reg) {
  struct hook_log* log = arg;
  assert_ptr_equal(reg->handles[1], reg);
  log->detached++;
}

static void test_registration_hooks(void** state) {
  (void)state;
  static char mem[4096];
  struct hook_log log = {0};
  struct mem_regs regs;
  struct mem_reg *a = NULL, *b = NULL, *c = NULL;
  const struct transport t1 = {.name = "t1", .id = 1}, t0 = {.name = "t0", .id = 0};
  mem_regs_init(&regs, &(struct mem_reg_hooks){log_attach, log_detach, &log});
  assert_int_equal(mem_reg_add(&regs, mem, 1024, &a), ncclSuccess);
  assert_int_equal(mem_reg_add(&regs, mem + 2048, 1024, &b), ncclSuccess);
  log.fail_next = 1; /* a transport cannot pin it: not registered at all */
  assert_int_equal(mem_reg_add(&regs, mem + 1024, 512, &c), ncclSystemError);
  assert_null(mem_reg_find(&regs, mem + 1024, 512));
  log.fail_next = 0;
  assert_int_equal(log.attached, 2);

  /* The descriptor: a's handle for t1 inside a, none past its end or for t0. */
  struct transport_buf d = mem_transport_buf(mem + 10, 100, MEM_HOST, a, &t1);
  assert_ptr_equal(d.reg, a);
  assert_int_equal(d.mem, TRANSPORT_CAP_HOST_MEM);
  assert_null(mem_transport_buf(mem + 1000, 100, MEM_HOST, a, &t1).reg);
  assert_null(mem_transport_buf(mem + 10, 100, MEM_HOST, a, &t0).reg);
  assert_null(mem_transport_buf(mem + 10, 100, MEM_HOST, NULL, &t1).reg);
  assert_int_equal(mem_transport_buf(mem, 1, MEM_DEVICE, NULL, &t1).mem, TRANSPORT_CAP_DEVICE_MEM);

  assert_int_equal(mem_reg_remove(&regs, a), ncclSuccess);
  assert_int_equal(log.detached, 1);
  mem_regs_free(&regs); /* b detached here, once */
  assert_int_equal(log.detached, 2);
}

/* A pointer ncclMemAlloc did not give, or gave back already, is refused,
 * never handed to free(): a stack buffer, the heap, the inside of a
 * block, a block freed twice. */
static void test_mem_free_refusals(void** state) {
  (void)state;
  char on_stack[64];
  void* heap = malloc(64);
  void* p = NULL;
  assert_int_equal(ncclMemFree(on_stack), ncclInvalidArgument);
  assert_int_equal(ncclMemFree(heap), ncclInvalidArgument);
  assert_int_equal(ncclMemAlloc(&p, 10000), ncclSuccess);
  assert_int_equal(ncclMemFree((char*)p + 64), ncclInvalidArgument);
  assert_int_equal(ncclMemFree(p), ncclSuccess);
  assert_int_equal(ncclMemFree(p), ncclInvalidArgument);
  assert_int_equal(ncclMemFree(NULL), ncclSuccess);
  assert_int_equal(ncclMemAlloc(&p, SIZE_MAX), ncclInvalidArgument);
  free(heap);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mem_free_refusals),
      cmocka_unit_test(test_query_and_copy),
      cmocka_unit_test(test_registrations),
      cmocka_unit_test(test_registration_hooks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
