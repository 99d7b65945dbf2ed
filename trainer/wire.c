/* Byte counts of the traffic a rank hands to Braid (wire.h). */
#include "wire.h"

#include <string.h>

size_t wire_type_bytes(ncclDataType_t type) {
  /* by ncclDataType_t: i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 e4m3 e5m2 */
  static const unsigned char kBytes[WIRE_NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (int)type >= 0 && (int)type < WIRE_NTYPES ? kBytes[type] : 4;
}

void wire_add(wire_t* w, wire_coll_t coll, ncclDataType_t type, size_t count) {
  if ((int)type >= 0 && (int)type < WIRE_NTYPES)
    w->bytes[coll][type] += (double)count * (double)wire_type_bytes(type);
}

void wire_add_other(wire_t* w, ncclDataType_t type, size_t count) {
  w->other += (double)count * (double)wire_type_bytes(type);
}

double wire_total(const wire_t* w) {
  double t = 0;
  for (int c = 0; c < WIRE_NCOLLS; c++)
    for (int k = 0; k < WIRE_NTYPES; k++) t += w->bytes[c][k];
  return t;
}

static const char* type_name(int type) {
  static const char* const kNames[WIRE_NTYPES] = {"i8",  "u8",  "i32", "u32",  "i64",  "u64",
                                                  "f16", "f32", "f64", "bf16", "e4m3", "e5m2"};
  return kNames[type];
}

void wire_describe(const wire_t* w, double scale, char* out, size_t outlen) {
  static const char* const kColls[WIRE_NCOLLS] = {"allreduce", "reduce", "broadcast",
                                                  "allgather", "gather", "send"};
  size_t used = 0;
  out[0] = '\0';
  for (int c = 0; c < WIRE_NCOLLS; c++)
    for (int k = 0; k < WIRE_NTYPES; k++)
      if (w->bytes[c][k] > 0 && used < outlen)
        used += (size_t)snprintf(out + used, outlen - used, "%s%s %s %.1f MB", used ? ", " : "",
                                 kColls[c], type_name(k), w->bytes[c][k] * scale / 1e6);
  if (used == 0) snprintf(out, outlen, "nothing");
}
