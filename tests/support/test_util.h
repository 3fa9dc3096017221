/* Test utilities: a deterministic RNG, normalized error metrics, a pass/fail
 * tally with a check macro that prints the case and the numbers, and a short
 * text description of a config for those messages. */
#ifndef SNEPPX_TEST_UTIL_H
#define SNEPPX_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include "sneppx/config.h"

/* 1 when built with AddressSanitizer (gcc or clang), else 0: its shadow memory
 * and quarantine make address-space and resident-set bounds meaningless. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif
#ifndef TEST_UNDER_ASAN
#define TEST_UNDER_ASAN 0
#endif

/* splitmix64: tiny, seedable, the same sequence on every platform. */
typedef struct test_rng {
    uint64_t state;
} test_rng;

test_rng test_rng_seeded(uint64_t seed);
uint64_t test_rng_next(test_rng *rng);
double test_rng_uniform(test_rng *rng);                       /* [0, 1) */
float test_rng_symmetric(test_rng *rng, float amplitude);     /* [-amplitude, amplitude) */
void test_fill_uniform(test_rng *rng, float *x, int64_t n, float amplitude);

/* Error of a float32 result against a float64 reference:
 *   max_normalized = max|got - want| / max|want|   (absolute if want is all zero)
 *   rms_relative   = sqrt(sum (got - want)^2 / sum want^2)  (absolute RMS if zero)
 * non_finite counts NaN/Inf in got (each one fails any threshold). */
typedef struct test_error {
    double max_abs;
    double want_max_abs;
    double max_normalized;
    double rms_relative;
    int64_t non_finite;
    int64_t worst_index;
} test_error;

test_error test_compare(const float *got, const double *want, int64_t n);
test_error test_compare_float(const float *got, const float *want, int64_t n);
int test_error_within(const test_error *error, double max_normalized, double rms_relative);

/* Counts of one test program; every check goes through test_check(). */
typedef struct test_tally {
    int passed;
    int failed;
    int skipped;
} test_tally;

/* Records one outcome. On failure prints "FAIL <file>:<line>: <condition>: <message>". */
int test_check_at(test_tally *tally, int ok, const char *condition, const char *file, int line,
                  const char *format, ...) __attribute__((format(printf, 6, 7)));

#define TEST_CHECK(tally, condition, ...) \
    test_check_at((tally), (condition) ? 1 : 0, #condition, __FILE__, __LINE__, __VA_ARGS__)

/* Prints "<passed> passed, <failed> failed[, <skipped> skipped]" and returns the exit code. */
int test_finish(const test_tally *tally);

/* A test of independent parts that ctest splits ("ctest: N shards" in its source,
 * tests/CMakeLists.txt): runs part i of parts[] when i % N is the shard that
 * `--shard I/N` on the command line names (every part without it). Returns
 * test_finish's exit code, or 2 for a bad command line. */
typedef void (*test_part)(void);
int test_run_parts(int argc, char **argv, const test_part *parts, int count, test_tally *tally);

/* "custom h80 H8/KV2 d32 r16 half theta=10000 llama3(f=8) mpe=64 w13 bias=1/1 flash"
 * (head_dim and rotary dim resolved as the reference resolves them). */
void test_describe_config(const sneppx_config *config, char *text, size_t size);

/* A quiet NaN no computation produces: buffers a refused call must leave
 * untouched are filled with it first, and checked bit for bit after. */
#define TEST_SENTINEL_BITS 0x7fa5a5a5u
void test_fill_sentinel(float *data, size_t count);
int test_all_sentinel(const float *data, size_t count);

/* True when the environment variable is set to something other than "" or "0". */
int test_env_flag(const char *name);

#endif
