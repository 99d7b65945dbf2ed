/*
 * The memory module: every buffer is host memory for now, mem_copy keeps
 * memmove's rule, and the registration cache finds the registration that
 * covers a range (what transports that map or pin memory will ask).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "mem.h"

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
  mem_regs_init(&regs);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_query_and_copy),
      cmocka_unit_test(test_registrations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
