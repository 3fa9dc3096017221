/* Fuzzes the safetensors reader: the input is a whole file (8-byte header
 * length, JSON header, data), opened through a memfd's /proc path so no disk
 * is touched. Promises: a file that opens lists tensors sorted by name that
 * sneppx_safetensors_find() finds again, with byte sizes inside the file and
 * equal to the span of the data_offsets its header gives; every
 * F32/F16/BF16/F64 tensor converts (ASan checks every byte read stays in the
 * buffers), each element exactly as the harness converts the tensor's own
 * bytes (read from the input at those offsets) by a method of its own: F32
 * as stored, BF16 and F16 widened by value (a NaN keeps its payload), F64
 * rounded to nearest, ties to even, in integer arithmetic (a NaN stays a
 * NaN), compared bit for bit; other dtypes are refused as unsupported. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "sneppx/safetensors.h"

static int memfd = -1;
static char memfd_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    memfd = memfd_create("sneppx-fuzz-safetensors", MFD_CLOEXEC);
    if (memfd < 0) {
        perror("memfd_create");
        exit(1);
    }
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    return 0;
}

static int converts(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0 ||
           strcmp(dtype, "F64") == 0;
}

static float bits_to_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint32_t float_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static uint64_t load_le(const uint8_t *p, int bytes)
{
    uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; i--)
        value = value << 8 | p[i];
    return value;
}

/* binary16 by value: a finite one is (-1)^s * m * 2^(e - 25), m with its
 * implicit bit (e at least 1), exact in a double and in a float. */
static float reference_f16(uint16_t half)
{
    const unsigned sign = half >> 15, exponent = half >> 10 & 0x1f, mantissa = half & 0x3ff;
    if (exponent == 0x1f) /* inf, or a NaN whose payload moves to the top of the float's */
        return bits_to_float((uint32_t)sign << 31 | 0x7f800000u | (uint32_t)mantissa << 13);
    const double magnitude = ldexp(exponent ? 0x400 + mantissa : mantissa, (exponent ? (int)exponent : 1) - 25);
    return (float)(sign ? -magnitude : magnitude);
}

/* bfloat16: the top half of a float32. */
static float reference_bf16(uint16_t bf16) { return bits_to_float((uint32_t)bf16 << 16); }

/* binary64 rounded to nearest, ties to even, in integers: the value is m * 2^e
 * with m < 2^53; keep its bits down to the float's last place (2^(x - 23) for
 * a value in [2^x, 2^(x + 1)), never below the subnormals' 2^-149) and round
 * on the rest. q <= 2^24, so ldexpf is exact, or inf past the float range.
 * A NaN gives a NaN (its payload is not promised). */
static float reference_f64(uint64_t bits)
{
    const int sign = (int)(bits >> 63), exponent = (int)(bits >> 52 & 0x7ff);
    const uint64_t fraction = bits & ((UINT64_C(1) << 52) - 1);
    float magnitude = 0.0f;
    if (exponent == 0x7ff) {
        magnitude = fraction ? NAN : INFINITY;
    } else {
        const uint64_t m = exponent ? fraction | UINT64_C(1) << 52 : fraction;
        const int e = (exponent ? exponent : 1) - 1075;
        if (m != 0) {
            int last = 63 - __builtin_clzll(m) + e - 23;
            if (last < -149)
                last = -149;
            const int shift = last - e; /* bits of m below the float's last place */
            uint64_t q = 0;
            if (shift <= 0) {
                q = m << -shift;
            } else if (shift <= 54) { /* beyond, m is below half the smallest subnormal */
                q = m >> shift;
                const uint64_t rest = m & ((UINT64_C(1) << shift) - 1), half = UINT64_C(1) << (shift - 1);
                if (rest > half || (rest == half && (q & 1)))
                    q++;
            }
            magnitude = ldexpf((float)q, last);
        }
    }
    return sign ? -magnitude : magnitude;
}

/* Element i of a tensor of dtype whose bytes start at raw, as the harness converts it. */
static float reference(const char *dtype, const uint8_t *raw, int64_t i)
{
    if (strcmp(dtype, "F32") == 0)
        return bits_to_float((uint32_t)load_le(raw + 4 * i, 4));
    if (strcmp(dtype, "F16") == 0)
        return reference_f16((uint16_t)load_le(raw + 2 * i, 2));
    if (strcmp(dtype, "BF16") == 0)
        return reference_bf16((uint16_t)load_le(raw + 2 * i, 2));
    return reference_f64(load_le(raw + 8 * i, 8));
}

/* Each converted element against the harness's own conversion of the file's bytes. */
static void check_values(const sneppx_tensor_info *info, const uint8_t *raw, const float *out)
{
    const int f64 = strcmp(info->dtype, "F64") == 0;
    for (int64_t i = 0; i < info->element_count; i++) {
        const float expected = reference(info->dtype, raw, i);
        const int same = f64 && isnan(expected) ? isnan(out[i]) : float_bits(out[i]) == float_bits(expected);
        FUZZ_ASSERT(same, "'%s' (%s) element %lld: read as %a (0x%08x), the file's bytes are %a (0x%08x)",
                    info->name, info->dtype, (long long)i, out[i], float_bits(out[i]), expected,
                    float_bits(expected));
    }
}

/* The bytes of the tensor named name: where the header's data_offsets put them,
 * or NULL when they do not span byte_size bytes inside the data. */
static const uint8_t *tensor_bytes(const cJSON *header, const char *name, uint64_t byte_size, const uint8_t *data,
                                   uint64_t data_size)
{
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(header, name),
                                                            "data_offsets");
    const cJSON *begin = cJSON_GetArrayItem(offsets, 0), *end = cJSON_GetArrayItem(offsets, 1);
    if (!cJSON_IsNumber(begin) || !cJSON_IsNumber(end) || !(begin->valuedouble >= 0) ||
        !(end->valuedouble <= (double)data_size) || end->valuedouble - begin->valuedouble != (double)byte_size)
        return NULL;
    return data + (uint64_t)begin->valuedouble;
}

static void check_file(const sneppx_safetensors *file, const uint8_t *bytes, size_t file_size)
{
    /* The header again, parsed here, for each tensor's data_offsets. */
    const uint64_t header_size = load_le(bytes, 8);
    const uint8_t *data = bytes + 8 + header_size;
    const uint64_t data_size = file_size - 8 - header_size;
    cJSON *header = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)header_size);
    FUZZ_ASSERT(cJSON_IsObject(header), "an opened file's header is not a JSON object");
    const int64_t count = sneppx_safetensors_tensor_count(file);
    const char *previous = NULL;
    for (int64_t i = 0; i < count; i++) {
        sneppx_tensor_info info;
        FUZZ_ASSERT(sneppx_safetensors_tensor_info(file, i, &info) == SNEPPX_OK, "tensor %lld: %s", (long long)i,
                    sneppx_last_error());
        FUZZ_ASSERT(!previous || strcmp(previous, info.name) < 0, "tensors not sorted: '%s' then '%s'", previous,
                    info.name);
        previous = info.name;
        FUZZ_ASSERT(sneppx_safetensors_find(file, info.name) == i, "find('%s') is not %lld", info.name, (long long)i);
        FUZZ_ASSERT(info.byte_size <= file_size && info.element_count >= 0, "'%s': %llu bytes in a %zu-byte file",
                    info.name, (unsigned long long)info.byte_size, file_size);
        const uint8_t *raw = tensor_bytes(header, info.name, info.byte_size, data, data_size);
        FUZZ_ASSERT(raw, "'%s': %llu bytes, not the span of its data_offsets inside the %llu-byte data", info.name,
                    (unsigned long long)info.byte_size, (unsigned long long)data_size);
        float *out = malloc(sizeof(float) * (size_t)(info.element_count ? info.element_count : 1));
        if (!out)
            continue;
        sneppx_status status = sneppx_safetensors_read_f32(file, i, out, info.element_count);
        FUZZ_ASSERT(converts(info.dtype) ? status == SNEPPX_OK : status == SNEPPX_ERR_UNSUPPORTED,
                    "'%s' (%s): %s", info.name, info.dtype, sneppx_last_error());
        if (status == SNEPPX_OK)
            check_values(&info, raw, out);
        free(out);
    }
    cJSON_Delete(header);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FUZZ_ASSERT(ftruncate(memfd, 0) == 0 && pwrite(memfd, data, size, 0) == (ssize_t)size, "memfd write");
    sneppx_safetensors *file = NULL;
    sneppx_status status = sneppx_safetensors_open(memfd_path, &file);
    if (status == SNEPPX_OK)
        check_file(file, data, size);
    else
        FUZZ_ASSERT(!file && sneppx_last_error()[0] != '\0', "status %d without a message", (int)status);
    sneppx_safetensors_close(file);
    return 0;
}
