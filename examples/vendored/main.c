/* A project that vendors one sneppx layer: `sneppx-gen --arch NAME -o gen/`
 * writes gen/sneppx_<arch>.{c,h}; this program compiles with them, packs random
 * weights, runs the forward pass and prints a checksum and the time.
 *
 * Built by the Makefile beside it, which passes the layer's header and its
 * symbol prefix (SNEPPX_LAYER_HEADER, SNEPPX_LAYER, SNEPPX_LAYER_UPPER), so the
 * same program works for every architecture.
 *
 *     usage: vendored [batch] [seq_len] [threads]
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include SNEPPX_LAYER_HEADER

#define CONCAT2(a, b) a##b
#define CONCAT(a, b) CONCAT2(a, b)
#define LAYER(name) CONCAT(SNEPPX_LAYER, name)
#define LAYER_MACRO(name) CONCAT(SNEPPX_LAYER_UPPER, name)

static double seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* Uniform in [-scale, scale) from a 64-bit LCG: reproducible on every platform. */
static void fill_random(float *data, int64_t count, uint64_t seed, float scale)
{
    uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < count; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = scale * ((float)(state >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
}

static float *alloc_floats(int64_t count)
{
    size_t bytes = ((size_t)count * sizeof(float) + 63) / 64 * 64;
    float *data = aligned_alloc(64, bytes ? bytes : 64);
    if (!data) {
        fprintf(stderr, "vendored: out of memory (%lld floats)\n", (long long)count);
        exit(1);
    }
    return data;
}

int main(int argc, char **argv)
{
    const int64_t batch = argc > 1 ? atoll(argv[1]) : 1;
    const int64_t seq_len = argc > 2 ? atoll(argv[2]) : 128;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const int64_t hidden = LAYER_MACRO(_HIDDEN_SIZE);

    /* Random HF weights, scaled like a trained layer's (~1/sqrt(fan_in)). */
    struct LAYER(_weights) weights;
    float *owned[16];
    int owned_count = 0;
    uint64_t seed = 1;
#define FILL_FIELD(field, floats)                                                  \
    {                                                                              \
        float *data = alloc_floats(floats);                                        \
        fill_random(data, floats, seed++, 1.0f / sqrtf((float)hidden));           \
        weights.field = data;                                                      \
        owned[owned_count++] = data;                                               \
    }
    LAYER_MACRO(_WEIGHT_FIELDS)(FILL_FIELD)
#undef FILL_FIELD

    float *packed = alloc_floats(LAYER(_packed_floats)());
    if (LAYER(_pack)(&weights, packed) != SNEPPX_AOT_OK) {
        fprintf(stderr, "vendored: pack failed: %s\n", LAYER(_last_error)());
        return 1;
    }
    for (int i = 0; i < owned_count; i++)
        free(owned[i]);

    const int64_t scratch_floats = LAYER(_scratch_floats)(batch, seq_len, threads);
    if (scratch_floats < 0) {
        fprintf(stderr, "vendored: %s\n", LAYER(_last_error)());
        return 1;
    }
    float *scratch = alloc_floats(scratch_floats);
    float *hidden_states = alloc_floats(batch * seq_len * hidden);
    float *out = alloc_floats(batch * seq_len * hidden);
    fill_random(hidden_states, batch * seq_len * hidden, 99, 1.0f);

    /* The first call touches fresh scratch pages; time the best of the next ones. */
    double best = INFINITY;
    for (int run = 0; run < 4; run++) {
        const double start = seconds();
        const int status = LAYER(_forward)(packed, batch, seq_len, hidden_states, NULL, NULL, NULL, out, scratch, threads);
        const double elapsed = seconds() - start;
        if (status != SNEPPX_AOT_OK) {
            fprintf(stderr, "vendored: forward failed: %s\n", LAYER(_last_error)());
            return 1;
        }
        if (run > 0 && elapsed < best)
            best = elapsed;
    }

    double sum = 0.0, abs_sum = 0.0;
    int finite = 1;
    for (int64_t i = 0; i < batch * seq_len * hidden; i++) {
        finite &= isfinite(out[i]) != 0;
        sum += out[i];
        abs_sum += fabs(out[i]);
    }
    printf("layer %s: batch %lld, seq_len %lld, threads %d\n", SNEPPX_LAYER_HEADER, (long long)batch,
           (long long)seq_len, threads);
    printf("checksum: sum %.6e, mean |out| %.6e\n", sum, abs_sum / (double)(batch * seq_len * hidden));
    printf("forward: %.3f ms (best of 3 after a warm-up call)\n", best * 1e3);

    /* Errors come back as codes with a message naming the argument; nothing aborts. */
    const int status = LAYER(_forward)(packed, batch, 0, hidden_states, NULL, NULL, NULL, out, scratch, threads);
    printf("seq_len 0 -> status %d: %s\n", status, LAYER(_last_error)());

    free(packed);
    free(scratch);
    free(hidden_states);
    free(out);
    if (!finite || status != SNEPPX_AOT_ERR_INVALID_ARGUMENT || !(abs_sum > 0.0)) {
        fprintf(stderr, "vendored: FAILED (finite output %d, error status %d)\n", finite, status);
        return 1;
    }
    return 0;
}
