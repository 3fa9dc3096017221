/* Times a target's GEMM tile candidates on this host (runtime/gemm_tuner.h). */
#include "gemm_tuner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "big_alloc.h"
#include "error.h"
#include "gemm_pack.h"
#include "host.h"
#include "kernel_args.h"
#include "kernels.h"
#include "sneppx/config.h"
#include "sneppx/limits.h"
#include "sneppx_abi.h"
#include "team.h"

struct sneppx_gemm_tune_shape sneppx_gemm_tune_default_shape(void)
{
    return (struct sneppx_gemm_tune_shape){.rows = 512, .k = 4096, .n = 4096, .threads = 0, .rounds = 5};
}

/* The median of count (at most SNEPPX_TUNE_MAX_ROUNDS) times; sorts a copy. */
static double median(const double *ms, int count)
{
    double sorted[SNEPPX_TUNE_MAX_ROUNDS];
    memcpy(sorted, ms, sizeof *ms * (size_t)count);
    for (int i = 1; i < count; i++)
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            const double swap = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = swap;
        }
    return count % 2 ? sorted[count / 2] : 0.5 * (sorted[count / 2 - 1] + sorted[count / 2]);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

struct operands {
    const struct sneppx_gemm_tune_shape *shape;
    int threads;
    int64_t mr;
    const float *src;
    const void *panels;
    float *dst;
};

/* One product over the forward pass's partition (runtime/forward.c's run_gemm). */
static double run_once(const sneppx_kernel *kernel, const struct operands *ops)
{
    const int64_t rows = ops->shape->rows, n = ops->shape->n;
    const struct sneppx_gemm_tiles tile = sneppx_gemm_tiles_for(rows, n, ops->mr, 1, ops->threads);
    const int64_t row_tiles = (rows + tile.rows - 1) / tile.rows, col_tiles = (n + tile.cols - 1) / tile.cols;
    const double start = now_ms();
#pragma omp parallel for schedule(static) num_threads(ops->threads)
    for (int64_t task = 0; task < row_tiles * col_tiles; task++) {
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = task % row_tiles * tile.rows;
        args.row_end = args.row_begin + tile.rows < rows ? args.row_begin + tile.rows : rows;
        args.col_begin = task / row_tiles * tile.cols;
        args.col_end = args.col_begin + tile.cols < n ? args.col_begin + tile.cols : n;
        args.src = ops->src;
        args.src_stride = ops->shape->k;
        args.weight = ops->panels;
        args.dst = ops->dst;
        args.dst_stride = n;
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
    return now_ms() - start;
}

static sneppx_status check_shape(const struct sneppx_target *target, const struct sneppx_gemm_tune_shape *shape)
{
    if (!target)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: target is NULL");
    const char *missing = sneppx_host_missing_feature(target);
    if (missing)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "tune: target %s needs %s, which this host lacks", target->name,
                           missing);
    if (!shape)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: shape is NULL");
    if (shape->rows < 1 || shape->rows > SNEPPX_MAX_TOKENS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: shape rows %lld is outside [1, %lld]",
                           (long long)shape->rows, (long long)SNEPPX_MAX_TOKENS);
    if (shape->k < 1 || shape->k > SNEPPX_MAX_DIM || shape->n < 1 || shape->n > SNEPPX_MAX_DIM)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: shape k %lld or n %lld is outside [1, %lld]",
                           (long long)shape->k, (long long)shape->n, (long long)SNEPPX_MAX_DIM);
    if (shape->threads < 0 || shape->threads > SNEPPX_MAX_THREADS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: shape threads %d is outside [0, %d]", shape->threads,
                           (int)SNEPPX_MAX_THREADS);
    if (shape->rounds < 1 || shape->rounds > SNEPPX_TUNE_MAX_ROUNDS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: shape rounds %d is outside [1, %d]", shape->rounds,
                           SNEPPX_TUNE_MAX_ROUNDS);
    return SNEPPX_OK;
}

/* Every candidate's kernel, resolved side by side (distinct keys compile in parallel). */
static sneppx_status resolve_candidates(const struct sneppx_target *target, int threads,
                                        struct sneppx_gemm_tune_result *result, const sneppx_kernel **kernels,
                                        int64_t k, int64_t n)
{
    static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER; /* a named omp critical is an exported symbol */
    sneppx_status failed = SNEPPX_OK;
    char message[512] = "";
    sneppx_kernel_prepare();
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int i = 0; i < result->count; i++) {
        const struct sneppx_gemm_tuning *tiles = &result->times[i].tiles;
        const int64_t values[] = {k, n, 0, SNEPPX_DTYPE_FLOAT32, tiles->kc, tiles->mc};
        const sneppx_status status = sneppx_kernel_resolve("gemm", values, target, &kernels[i]);
        if (status != SNEPPX_OK) {
            pthread_mutex_lock(&failure_lock);
            if (failed == SNEPPX_OK) {
                failed = status;
                snprintf(message, sizeof message, "%s", sneppx_last_error());
            }
            pthread_mutex_unlock(&failure_lock);
        }
    }
    return failed == SNEPPX_OK ? SNEPPX_OK : sneppx_fail(failed, "tune: %s", message);
}

/* On a host whose speed drifts (a shared VM: rounds of one candidate 10%
 * apart), the fastest round alone picked candidates that lost to the defaults
 * at other shapes, so a candidate must beat them on its median round too; and
 * the candidate with the luckiest single round may fail that while another
 * passes (Zen 5: KC 128 x MC 28 had the fastest round, 1.047x, and a median
 * 0.985x; KC 512 x MC 14 beat the defaults 1.041x and 1.037x), so every
 * candidate is weighed, not only the fastest. */
static int beats(const struct sneppx_gemm_tune_time *candidate, const struct sneppx_gemm_tune_time *defaults)
{
    return candidate->ms * (1.0 + SNEPPX_TUNE_MIN_GAIN) <= defaults->ms &&
           candidate->median_ms * (1.0 + SNEPPX_TUNE_MIN_GAIN) <= defaults->median_ms;
}

int sneppx_gemm_tune_winner(const struct sneppx_gemm_tune_time *times, int count, int defaults)
{
    int winner = -1;
    for (int i = 0; i < count; i++) {
        if (defaults >= 0 && (i == defaults || !beats(&times[i], &times[defaults])))
            continue;
        if (winner < 0 || times[i].median_ms < times[winner].median_ms ||
            (times[i].median_ms == times[winner].median_ms && times[i].ms < times[winner].ms))
            winner = i;
    }
    return winner >= 0 ? winner : defaults;
}

sneppx_status sneppx_gemm_tune(const struct sneppx_target *target, const struct sneppx_gemm_tune_shape *shape,
                               struct sneppx_gemm_tune_result *result)
{
    sneppx_status status = check_shape(target, shape);
    if (status != SNEPPX_OK)
        return status;
    if (!result)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tune: result is NULL");
    const double start = now_ms();
    memset(result, 0, sizeof *result);
    result->defaults = -1;
    for (int i = 0; i < target->gemm_kc_candidate_count; i++)
        for (int j = 0; j < target->gemm_mc_candidate_count; j++) {
            struct sneppx_gemm_tune_time *t = &result->times[result->count];
            t->tiles.kc = target->gemm_kc_candidates[i];
            t->tiles.mc = target->gemm_mc_candidates[j];
            if (t->tiles.kc == target->gemm_kc && t->tiles.mc == target->gemm_mc)
                result->defaults = result->count;
            result->count++;
        }
    const int threads = sneppx_team_size(shape->threads);
    const sneppx_kernel *kernels[SNEPPX_TUNE_MAX_CANDIDATES];
    if ((status = resolve_candidates(target, threads, result, kernels, shape->k, shape->n)) != SNEPPX_OK)
        return status;
    result->compile_ms = now_ms() - start;

    const int64_t rows = shape->rows, k = shape->k, n = shape->n;
    const size_t panel_bytes = (size_t)sneppx_gemm_packed_bytes(k, n, target->gemm_nr, SNEPPX_GEMM_FLOAT32);
    float *src = sneppx_alloc_floats((size_t)(rows * k)), *dst = sneppx_alloc_floats((size_t)(rows * n));
    float *weights = sneppx_alloc_floats((size_t)(n * k));
    void *panels = sneppx_alloc_floats(panel_bytes / sizeof(float));
    double *round_ms = malloc(sizeof(double) * (size_t)result->count * (size_t)shape->rounds);
    if (!src || !dst || !weights || !panels || !round_ms) {
        free(src), free(dst), free(weights), free(panels), free(round_ms);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "tune: no memory for a [%lld, %lld] x [%lld, %lld] product",
                           (long long)rows, (long long)k, (long long)k, (long long)n);
    }
    /* Values in [-1, 1): the timing does not depend on them, only on their being finite. */
    uint32_t state = 12345u;
    for (int64_t i = 0; i < rows * k; i++)
        src[i] = (float)((state = state * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    for (int64_t i = 0; i < n * k; i++)
        weights[i] = (float)((state = state * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    /* Every candidate reads the same panels: kc and mc change no layout. */
    sneppx_gemm_pack_matrix(kernels[0], weights, k, n, panels, threads);
    free(weights);

    const struct operands ops = {shape, threads, target->gemm_mr, src, panels, dst};
    for (int i = 0; i < result->count; i++) {
        run_once(kernels[i], &ops); /* warm-up: pages, caches, frequency */
        result->times[i].ms = 1e300;
    }
    /* Interleaved rounds, each in another order, so drift in the machine's load
     * spreads over the candidates. */
    for (int round = 0; round < shape->rounds; round++)
        for (int j = 0; j < result->count; j++) {
            const int i = (j + round) % result->count;
            const double ms = run_once(kernels[i], &ops);
            round_ms[i * shape->rounds + round] = ms;
            if (ms < result->times[i].ms)
                result->times[i].ms = ms;
        }
    free(src), free(dst), free(panels);

    result->fastest = 0;
    for (int i = 0; i < result->count; i++) {
        result->times[i].gflops = 2.0 * (double)rows * (double)k * (double)n / (result->times[i].ms * 1e6);
        result->times[i].median_ms = median(round_ms + i * shape->rounds, shape->rounds);
        if (result->times[i].ms < result->times[result->fastest].ms)
            result->fastest = i;
    }
    result->winner = sneppx_gemm_tune_winner(result->times, result->count, result->defaults);
    free(round_ms);
    result->total_ms = now_ms() - start;
    return SNEPPX_OK;
}
