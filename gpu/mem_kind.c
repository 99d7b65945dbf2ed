/*
 * What every build shares of the memory kinds (mem_kind.h).
 */
#include "mem_kind.h"

const char* mem_kind_name(enum mem_kind kind) {
  static const char* const names[MEM_KIND_COUNT] = {"host", "device", "managed"};
  return (unsigned)kind < MEM_KIND_COUNT ? names[kind] : "?";
}
