/* Disk cache miss, then hit: a kernel compiled once is written to the disk
 * cache; after the in-memory cache is dropped, and in a second process that
 * may not compile (SNEPPX_JIT=0), it is loaded from disk and computes exactly
 * (bit for bit) what the compiled one did. Prints compile and load times. */
#include "test_cache_common.h"

#include <limits.h>
#include <sys/stat.h>


#define GEMM_K 64
#define GEMM_N 96
#define GEMM_ROWS 5
#define RMSNORM_N 192

static const int64_t rmsnorm_values[] = {RMSNORM_N};
static const int64_t gemm_values[] = {GEMM_K, GEMM_N, 1, 0, 512, 56}; /* float32 weights; kc, mc */

/* Packs W, runs the GEMM over GEMM_ROWS rows and returns the normalized error
 * against a float64 loop; the output goes to out[GEMM_ROWS * GEMM_N]. */
static double gemm_error(const sneppx_kernel *kernel, float *out)
{
    float weight[GEMM_N * GEMM_K], bias[GEMM_N], src[GEMM_ROWS * GEMM_K];
    size_t packed_bytes =
        (size_t)sneppx_gemm_packed_floats(GEMM_K, GEMM_N, sneppx_host_target()->gemm_nr) * sizeof(float);
    float *packed = aligned_alloc(64, (packed_bytes + 63) / 64 * 64);
    test_rng rng = test_rng_seeded(11);
    test_fill_uniform(&rng, weight, GEMM_N * GEMM_K, 0.125f);
    test_fill_uniform(&rng, bias, GEMM_N, 0.5f);
    test_fill_uniform(&rng, src, GEMM_ROWS * GEMM_K, 1.0f);
    struct sneppx_args pack = {.struct_size = sizeof pack, .abi_version = SNEPPX_ABI_VERSION, .col_begin = 0,
                               .col_end = GEMM_N, .src = weight, .src_stride = GEMM_K, .dst = packed};
    kernel->entry[SNEPPX_ENTRY_PACK](&pack);
    struct sneppx_args product = {.struct_size = sizeof product, .abi_version = SNEPPX_ABI_VERSION,
                                  .row_begin = 0, .row_end = GEMM_ROWS, .col_begin = 0, .col_end = GEMM_N,
                                  .src = src, .src_stride = GEMM_K, .weight = packed, .bias = bias, .dst = out,
                                  .dst_stride = GEMM_N};
    kernel->entry[SNEPPX_ENTRY_RUN](&product);
    free(packed);
    double want[GEMM_ROWS * GEMM_N];
    for (int r = 0; r < GEMM_ROWS; r++)
        for (int c = 0; c < GEMM_N; c++) {
            double sum = bias[c];
            for (int k = 0; k < GEMM_K; k++)
                sum += (double)src[r * GEMM_K + k] * weight[c * GEMM_K + k];
            want[r * GEMM_N + c] = sum;
        }
    test_error error = test_compare(out, want, GEMM_ROWS * GEMM_N);
    return error.non_finite ? INFINITY : error.max_normalized;
}

static const sneppx_kernel *resolve(test_tally *tally, const char *family, const int64_t *values,
                                    sneppx_kernel_source want, sneppx_kernel_timing *timing)
{
    const sneppx_kernel *kernel = NULL;
    sneppx_status status = sneppx_kernel_resolve(family, values, sneppx_host_target(), &kernel);
    sneppx_kernel_last_timing(timing);
    TEST_CHECK(tally, status == SNEPPX_OK && kernel, "%s: %s %s", family, sneppx_status_name(status),
               sneppx_last_error());
    TEST_CHECK(tally, timing->source == want, "%s: source %d, want %d", timing->key, timing->source, want);
    return status == SNEPPX_OK ? kernel : NULL;
}

/* The second process: every kernel must come from disk (SNEPPX_JIT=0 is set). */
static int child_loads_from_disk(void)
{
    test_tally tally = {0};
    sneppx_kernel_timing timing;
    float first_row[RMSNORM_N], gemm_out[GEMM_ROWS * GEMM_N];
    const sneppx_kernel *norm = resolve(&tally, "rmsnorm", rmsnorm_values, SNEPPX_KERNEL_SOURCE_DISK, &timing);
    if (norm)
        TEST_CHECK(&tally, cache_test_rmsnorm_error(norm, RMSNORM_N, first_row) < 1e-6, "child rmsnorm");
    const sneppx_kernel *gemm = resolve(&tally, "gemm", gemm_values, SNEPPX_KERNEL_SOURCE_DISK, &timing);
    if (gemm)
        TEST_CHECK(&tally, gemm_error(gemm, gemm_out) < 1e-5, "child gemm");
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, stats.compiles == 0 && stats.disk_hits == 2, "child: %llu compiles, %llu disk hits",
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_hits);
    return test_finish(&tally);
}

static void check_entry_file(test_tally *tally, const char *dir, const char *key)
{
    char path[CACHE_TEST_PATH_MAX];
    struct stat info;
    cache_test_entry_path(dir, key, path, sizeof path);
    int exists = lstat(path, &info) == 0;
    TEST_CHECK(tally, exists && S_ISREG(info.st_mode) && (info.st_mode & 077) == 0,
               "%s: a regular file only its owner may read (mode %04o)", path,
               exists ? (unsigned)(info.st_mode & 07777) : 0u);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "child-loads-from-disk") == 0)
        return child_loads_from_disk();

    test_tally tally = {0};
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "hit") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_JIT");
    sneppx_kernel_timing compiled[2], loaded[2], again;
    float norm_compiled[RMSNORM_N], norm_loaded[RMSNORM_N];
    float gemm_compiled[GEMM_ROWS * GEMM_N], gemm_loaded[GEMM_ROWS * GEMM_N];

    /* Miss: both compile and land on disk. */
    const sneppx_kernel *norm = resolve(&tally, "rmsnorm", rmsnorm_values, SNEPPX_KERNEL_SOURCE_COMPILED, &compiled[0]);
    const sneppx_kernel *gemm = resolve(&tally, "gemm", gemm_values, SNEPPX_KERNEL_SOURCE_COMPILED, &compiled[1]);
    if (!norm || !gemm)
        return test_finish(&tally);
    double error = cache_test_rmsnorm_error(norm, RMSNORM_N, norm_compiled);
    TEST_CHECK(&tally, error < 1e-6, "compiled rmsnorm: normalized error %.3g (limit 1e-6)", error);
    error = gemm_error(gemm, gemm_compiled);
    TEST_CHECK(&tally, error < 1e-5, "compiled gemm: normalized error %.3g (limit 1e-5)", error);
    check_entry_file(&tally, dir, norm->key);
    check_entry_file(&tally, dir, gemm->key);
    TEST_CHECK(&tally, strcmp(sneppx_cache_dir(), dir) == 0, "cache dir '%s', want '%s'", sneppx_cache_dir(), dir);

    /* Memory hit: the same object. */
    const sneppx_kernel *norm_again = resolve(&tally, "rmsnorm", rmsnorm_values, SNEPPX_KERNEL_SOURCE_MEMORY, &again);
    TEST_CHECK(&tally, norm_again == norm, "a memory hit returns the same kernel");

    /* Disk hit after dropping the in-memory cache: the same results, bit for bit. */
    sneppx_kernel_cache_reset_for_testing();
    norm = resolve(&tally, "rmsnorm", rmsnorm_values, SNEPPX_KERNEL_SOURCE_DISK, &loaded[0]);
    gemm = resolve(&tally, "gemm", gemm_values, SNEPPX_KERNEL_SOURCE_DISK, &loaded[1]);
    if (norm) {
        error = cache_test_rmsnorm_error(norm, RMSNORM_N, norm_loaded);
        TEST_CHECK(&tally, error < 1e-6 && memcmp(norm_loaded, norm_compiled, sizeof norm_loaded) == 0,
                   "loaded rmsnorm: error %.3g, identical to the compiled one", error);
    }
    if (gemm) {
        error = gemm_error(gemm, gemm_loaded);
        TEST_CHECK(&tally, error < 1e-5 && memcmp(gemm_loaded, gemm_compiled, sizeof gemm_loaded) == 0,
                   "loaded gemm: error %.3g, identical to the compiled one", error);
    }
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, stats.compiles == 0 && stats.disk_hits == 2 && stats.disk_rejects == 0,
               "after the reset: %llu compiles, %llu disk hits, %llu rejects (want 0, 2, 0)",
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_hits,
               (unsigned long long)stats.disk_rejects);

    /* A second process, forbidden to compile, finds both on disk. */
    const char *child_env[] = {"SNEPPX_JIT=0", NULL};
    char *child_stderr = NULL;
    int code = cache_test_run_child("child-loads-from-disk", child_env, &child_stderr);
    TEST_CHECK(&tally, code == 0, "second process: exit %d, stderr:\n%s", code, child_stderr ? child_stderr : "");
    free(child_stderr);

    for (int i = 0; i < 2; i++)
        printf("%-28s compile %7.2f ms (+ link %.2f ms), disk load %.3f ms\n", compiled[i].key,
               compiled[i].compile_ms, compiled[i].load_ms, loaded[i].load_ms);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
