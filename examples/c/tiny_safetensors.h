/* A checkpoint small enough to write by hand: one BF16 tensor "model.w" of
 * `count` elements in a .safetensors file (docs/checkpoint.md, "File
 * layout"). Element i holds the bfloat16 of (i % 251) / 64 + step / 128, so
 * each step changes every value a little, as a training step does. Shared by
 * the example and the C API's test; C99, POSIX stdio only. */
#ifndef TERN_EXAMPLES_C_TINY_SAFETENSORS_H_
#define TERN_EXAMPLES_C_TINY_SAFETENSORS_H_

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The bfloat16 of a float: its top 16 bits, rounded to nearest even. */
static uint16_t tiny_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* Returns 0 on success, -1 when the file cannot be written. */
static int tiny_write_checkpoint(const char* path, uint32_t count, uint32_t step) {
  char header[160];
  int n = snprintf(header, sizeof header,
                   "{\"model.w\":{\"dtype\":\"BF16\",\"shape\":[%lu],\"data_offsets\":[0,%lu]}}",
                   (unsigned long)count, (unsigned long)count * 2ul);
  if (n < 0 || (size_t)n >= sizeof header - 8) return -1;
  while (n % 8 != 0) header[n++] = ' '; /* keep the data 8-byte aligned */
  FILE* f = fopen(path, "wb");
  if (f == NULL) return -1;
  unsigned char size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = (unsigned char)(((uint64_t)n >> (8 * i)) & 0xffu);
  int ok = fwrite(size_le, 1, 8, f) == 8 && fwrite(header, 1, (size_t)n, f) == (size_t)n;
  for (uint32_t i = 0; ok && i < count; ++i) {
    const uint16_t v = tiny_bf16((float)(i % 251u) / 64.0f + (float)step / 128.0f);
    const unsigned char le[2] = {(unsigned char)(v & 0xffu), (unsigned char)(v >> 8)};
    ok = fwrite(le, 1, 2, f) == 2;
  }
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : -1;
}

#endif /* TERN_EXAMPLES_C_TINY_SAFETENSORS_H_ */
