/* Internal: widening the 16-bit float types to float32, exactly (every
 * bfloat16 and binary16 value is a float32 value). */
#ifndef SNEPPX_RUNTIME_HALF_H
#define SNEPPX_RUNTIME_HALF_H
#include <stdint.h>
#include <string.h>

static inline float sneppx_f16_to_f32(uint16_t half)
{
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1fu;
    uint32_t mantissa = half & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | (mantissa << 13); /* inf, NaN keeps its payload */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13); /* rebias 15 -> 127 */
    } else {
        /* zero or subnormal: exactly mantissa * 2^-24, representable in float32 */
        float magnitude = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline float sneppx_bf16_to_f32(uint16_t bf16)
{
    uint32_t bits = (uint32_t)bf16 << 16; /* bfloat16 is the top half of a float32 */
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#endif
