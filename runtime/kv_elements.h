/* Internal: the KV cache's element types from and to float32, where the runtime
 * writes the pages (appending K/V) and reads them for the gathered attention
 * path. The decode kernel widens the same bits in registers
 * (templates/attn_decode.c.j2); these are the runtime's one implementation.
 *
 * bfloat16 / float16: rounded to nearest even; NaN stays a quiet NaN of its
 * sign, float16 overflows to inf (at 65520 in magnitude).
 * int8: symmetric, one float32 scale per row: scale = max|x| / 127 (float32
 * division), q = the float32 quotient x / scale rounded to nearest even, clamped to [-127, 127];
 * an all-zero row has scale 0; a row holding NaN or inf has scale NaN and q 0,
 * so it reads back as NaN throughout (as a float32 row with NaN poisons the
 * rows that see it). */
#ifndef SNEPPX_RUNTIME_KV_ELEMENTS_H
#define SNEPPX_RUNTIME_KV_ELEMENTS_H
#include <stdint.h>

#include "sneppx/config.h"

uint16_t sneppx_kv_bf16_bits(float x);
uint16_t sneppx_kv_f16_bits(float x);
float sneppx_kv_f16_value(uint16_t bits);

/* Stores n floats as a row of dtype at dst; int8 writes the row's scale to *scale
 * (other types leave it alone; it may be NULL for them). */
void sneppx_kv_store_row(sneppx_dtype dtype, void *dst, float *scale, const float *src, int64_t n);
/* Widens a row of dtype to n floats (int8: times scale). */
void sneppx_kv_load_row(sneppx_dtype dtype, float *dst, const void *src, float scale, int64_t n);

#endif
