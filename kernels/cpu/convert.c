/*
 * Scalar conversions between float and the narrow float formats (half,
 * bfloat16, fp8 e4m3/e5m2): the exported names of kern_convert.h, which
 * the CUDA kernels share.
 */
#include "kern_convert.h"
#include "kernels.h"

float kern_half_to_float(uint16_t h) {
  return kc_half_to_float(h);
}

uint16_t kern_float_to_half(float f) {
  return kc_float_to_half(f);
}

float kern_bf16_to_float(uint16_t h) {
  return kc_bf16_to_float(h);
}

uint16_t kern_float_to_bf16(float f) {
  return kc_float_to_bf16(f);
}

float kern_e4m3_to_float(uint8_t v) {
  return kc_e4m3_to_float(v);
}

uint8_t kern_float_to_e4m3(float f) {
  return kc_float_to_e4m3(f);
}

float kern_e5m2_to_float(uint8_t v) {
  return kc_e5m2_to_float(v);
}

uint8_t kern_float_to_e5m2(float f) {
  return kc_float_to_e5m2(f);
}
