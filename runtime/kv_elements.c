/* The KV cache's element conversions (kv_elements.h says what each type does). */
#include <math.h>
#include <string.h>

#include "kv_elements.h"

uint16_t sneppx_kv_bf16_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t sneppx_kv_f16_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (magnitude >= 0x47800000u) /* 2^16 and beyond (inf too); 65520 up to it carries into inf below */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {
        /* Below 2^-14: a float16 subnormal (or zero). Adding 0.5 puts its mantissa in
         * the low bits of the sum, rounded to nearest even by float32's own addition. */
        float value, sum;
        memcpy(&value, &magnitude, sizeof value);
        sum = value + 0.5f;
        uint32_t sum_bits;
        memcpy(&sum_bits, &sum, sizeof sum_bits);
        return (uint16_t)(sign | (sum_bits - 0x3f000000u));
    }
    /* Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even;
     * a carry into the exponent is right. */
    return (uint16_t)(sign | ((magnitude - 0x38000000u + 0xfffu + ((magnitude >> 13) & 1u)) >> 13));
}

float sneppx_kv_f16_value(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent == 0) {
        const float value = ldexpf((float)mantissa, -24); /* exact */
        memcpy(&bits, &value, sizeof bits);
        bits |= sign;
    } else {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static void quantize_int8(int8_t *dst, float *scale, const float *src, int64_t n)
{
    float most = 0.0f;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        finite &= isfinite(src[i]) != 0;
        most = fabsf(src[i]) > most ? fabsf(src[i]) : most;
    }
    /* A largest |x| below 127 times the smallest subnormal makes the scale 0 as all-zero
     * rows do (and x / 0 is no value to round): every element 0, as the kernels' own
     * quantizer (narrow.c.j2's sneppx_i8_bits) stores it. */
    const float s = most / 127.0f;
    if (!finite || !(s > 0.0f)) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = 0;
        *scale = finite ? 0.0f : NAN;
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const float q = nearbyintf(src[i] / s); /* the default rounding mode: nearest even */
        dst[i] = (int8_t)(q > 127.0f ? 127 : q < -127.0f ? -127 : (int)q);
    }
    *scale = s;
}

void sneppx_kv_store_row(sneppx_dtype dtype, void *dst, float *scale, const float *src, int64_t n)
{
    uint16_t *narrow = dst;
    switch (dtype) {
    case SNEPPX_DTYPE_BFLOAT16:
        for (int64_t i = 0; i < n; i++)
            narrow[i] = sneppx_kv_bf16_bits(src[i]);
        return;
    case SNEPPX_DTYPE_FLOAT16:
        for (int64_t i = 0; i < n; i++)
            narrow[i] = sneppx_kv_f16_bits(src[i]);
        return;
    case SNEPPX_DTYPE_INT8:
        quantize_int8(dst, scale, src, n);
        return;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
}

void sneppx_kv_load_row(sneppx_dtype dtype, float *dst, const void *src, float scale, int64_t n)
{
    const uint16_t *narrow = src;
    const int8_t *q = src;
    switch (dtype) {
    case SNEPPX_DTYPE_BFLOAT16:
        for (int64_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)narrow[i] << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return;
    case SNEPPX_DTYPE_FLOAT16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = sneppx_kv_f16_value(narrow[i]);
        return;
    case SNEPPX_DTYPE_INT8:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)q[i] * scale;
        return;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
}
