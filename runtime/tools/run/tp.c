/* sneppx-run --tp, under mpirun -np N: the layer split by heads over the N
 * ranks (include/sneppx/mpi.h), each rank holding its shard of the synthetic
 * weights. Prints each rank's heads, packed weight bytes, resident and peak
 * memory and times, then the slowest rank's median forward (or decode step):
 * every rank returns the whole output, so the slowest is the layer's time. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run.h"
#include "sneppx/mpi.h"
#include "sneppx/sneppx.h"

/* VmRSS and VmHWM of this process, in MiB (0 where /proc says nothing). */
static void memory_mib(double *resident, double *peak)
{
    *resident = *peak = 0;
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status && fgets(line, sizeof line, status)) {
        long long kib;
        if (sscanf(line, "VmRSS: %lld kB", &kib) == 1)
            *resident = (double)kib / 1024;
        else if (sscanf(line, "VmHWM: %lld kB", &kib) == 1)
            *peak = (double)kib / 1024;
    }
    if (status)
        fclose(status);
}

static void fill_random(float *data, int64_t count, unsigned *state)
{
    for (int64_t i = 0; i < count; i++) {
        *state = *state * 1103515245u + 12345u;
        data[i] = (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

/* What each rank reports to rank 0. */
struct rank_report {
    double q_begin, q_heads, kv_begin, kv_heads;
    double weight_mib, kv_cache_mib, resident_mib, peak_mib, create_ms, median_ms, flops;
};

/* Timed forwards of batch x seq tokens: the median of `repeat` after a warm-up.
 * Each starts at a barrier, so every rank times the same call. */
static int time_forwards(sneppx_layer *layer, int64_t batch, int64_t seq, int repeat, int64_t hidden,
                         double *median)
{
    const int64_t n = batch * seq * hidden;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    double *times = malloc(sizeof(double) * ((size_t)repeat + 1));
    int failed = !x || !y || !times;
    unsigned state = 12345;
    if (!failed)
        fill_random(x, n, &state);
    for (int r = 0; r <= repeat && !failed; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = run_now_ms();
        failed = sneppx_layer_forward(layer, batch, seq, x, NULL, NULL, NULL, y) != SNEPPX_OK;
        times[r] = run_now_ms() - t0;
    }
    if (!failed) {
        qsort(times + 1, (size_t)repeat, sizeof(double), run_compare_doubles);
        *median = times[1 + repeat / 2];
    }
    free(x), free(y), free(times);
    return failed;
}

/* A prefill of `context` tokens per sequence, then `steps` timed decode steps
 * through the shard's own KV cache (its K/V heads only, elements of kv_dtype). */
static int time_decode(sneppx_layer *layer, int64_t batch, int64_t context, int64_t steps, sneppx_dtype kv_dtype,
                       double *median, double *cache_mib)
{
    const sneppx_config *config = sneppx_layer_config(layer);
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    const int64_t hidden = config->hidden_size;
    options.capacity_tokens = run_kv_capacity_tokens(batch, context, steps);
    options.dtype = kv_dtype;
    sneppx_kv_cache *cache = NULL;
    int64_t *ids = calloc((size_t)batch, sizeof(int64_t)), *q_lens = calloc((size_t)batch, sizeof(int64_t));
    float *x = malloc(sizeof(float) * (size_t)(batch * run_forward_tokens(context) * hidden));
    float *y = malloc(sizeof(float) * (size_t)(batch * run_forward_tokens(context) * hidden));
    double *times = malloc(sizeof(double) * (size_t)(steps + 1));
    int failed = !ids || !q_lens || !x || !y || !times ||
                 sneppx_kv_cache_create(config, &options, &cache) != SNEPPX_OK;
    sneppx_kv_cache_stats stats;
    if (!failed && sneppx_kv_cache_stats_get(cache, &stats) == SNEPPX_OK)
        *cache_mib = (double)stats.total_pages * (double)stats.page_bytes / (1 << 20);
    for (int64_t s = 0; s < batch && !failed; s++)
        failed = sneppx_kv_cache_add_sequence(cache, &ids[s]) != SNEPPX_OK;
    unsigned state = 12345;
    for (int64_t begin = 0; begin < context && !failed; begin += RUN_PREFILL_CHUNK) {
        const int64_t chunk = context - begin < RUN_PREFILL_CHUNK ? context - begin : RUN_PREFILL_CHUNK;
        for (int64_t s = 0; s < batch; s++)
            q_lens[s] = chunk;
        fill_random(x, batch * chunk * hidden, &state);
        failed = sneppx_layer_forward_cached(layer, cache, 0, batch, ids, q_lens, x, NULL, NULL, y) != SNEPPX_OK;
    }
    for (int64_t s = 0; s < batch; s++)
        q_lens[s] = 1;
    for (int64_t step = 0; step <= steps && !failed; step++) { /* step 0 warms up */
        fill_random(x, batch * hidden, &state);
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = run_now_ms();
        failed = sneppx_layer_forward_cached(layer, cache, 0, batch, ids, q_lens, x, NULL, NULL, y) != SNEPPX_OK;
        times[step] = run_now_ms() - t0;
    }
    if (!failed) {
        qsort(times + 1, (size_t)steps, sizeof(double), run_compare_doubles);
        *median = times[1 + steps / 2];
    }
    sneppx_kv_cache_destroy(cache);
    free(ids), free(q_lens), free(x), free(y), free(times);
    return failed;
}

static int run_tp_arch(const char *arch, const struct run_options *o, int rank, int world)
{
    sneppx_config config;
    if (sneppx_config_from_name(arch, NULL, &config) != SNEPPX_OK) {
        if (rank == 0)
            fprintf(stderr, "sneppx-run: %s\n", sneppx_last_error());
        return 1;
    }
    config.num_threads = o->threads;
    config.use_flash_attn = o->flash;
    config.weight_dtype = o->weight_dtype;
    config.compute_dtype = o->compute_dtype;
    if (rank == 0) {
        if (o->decode)
            printf("== %s over %d ranks (tensor-parallel): decode, batch %lld, context %lld, %lld steps, %s, %s "
                   "weights, %s KV cache\n",
                   config.name, world, (long long)o->batch, (long long)o->context, (long long)o->decode,
                   o->flash ? "flash" : "sdpa", sneppx_dtype_name(o->weight_dtype), sneppx_dtype_name(o->kv_dtype));
        else
            printf("== %s over %d ranks (tensor-parallel): batch %lld, seq %lld, %s, %s weights\n", config.name,
                   world, (long long)o->batch, (long long)o->seq_len, o->flash ? "flash" : "sdpa",
                   sneppx_dtype_name(o->weight_dtype));
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = run_now_ms();
    sneppx_layer *layer = NULL;
    if (sneppx_mpi_layer_create(&config, NULL, MPI_COMM_WORLD, &layer) != SNEPPX_OK) {
        /* Every rank fails alike: rank 0 says why. */
        if (rank == 0)
            fprintf(stderr, "sneppx-run: %s: %s\n", arch, sneppx_last_error());
        return 1;
    }
    struct rank_report mine = {0};
    mine.create_ms = run_now_ms() - start;
    sneppx_shard_info info;
    sneppx_layer_shard_info(layer, &info);
    mine.q_begin = (double)info.q_head_begin, mine.q_heads = (double)info.q_heads;
    mine.kv_begin = (double)info.kv_head_begin, mine.kv_heads = (double)info.kv_heads;
    mine.weight_mib = sneppx_layer_weight_bytes(layer) / (1 << 20);
    const int failed = o->decode ? time_decode(layer, o->batch, o->context, o->decode, o->kv_dtype, &mine.median_ms,
                                               &mine.kv_cache_mib)
                                 : time_forwards(layer, o->batch, o->seq_len, o->repeat, config.hidden_size,
                                                 &mine.median_ms);
    if (failed)
        fprintf(stderr, "sneppx-run: rank %d: %s: %s\n", rank, arch, sneppx_last_error());
    mine.flops = o->decode ? 0 : sneppx_layer_flops(layer, o->batch, o->seq_len);
    memory_mib(&mine.resident_mib, &mine.peak_mib);
    sneppx_layer_destroy(layer);

    struct rank_report *all = rank == 0 ? malloc(sizeof *all * (size_t)world) : NULL;
    MPI_Gather(&mine, sizeof mine / sizeof(double), MPI_DOUBLE, all, sizeof mine / sizeof(double), MPI_DOUBLE, 0,
               MPI_COMM_WORLD);
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && all && !any_failed) {
        double slowest = 0, flops = 0, weights = 0;
        for (int r = 0; r < world; r++) {
            const struct rank_report *p = &all[r];
            printf("   rank %d: query heads %.0f-%.0f, K/V heads %.0f-%.0f; packed weights %.1f MiB, ", r, p->q_begin,
                   p->q_begin + p->q_heads - 1, p->kv_begin, p->kv_begin + p->kv_heads - 1, p->weight_mib);
            if (o->decode)
                printf("KV cache %.2f MiB, ", p->kv_cache_mib);
            printf("resident %.0f MiB (peak %.0f); ready in %.0f ms; %s median %.3f ms\n", p->resident_mib,
                   p->peak_mib, p->create_ms, o->decode ? "step" : "forward", p->median_ms);
            slowest = p->median_ms > slowest ? p->median_ms : slowest;
            flops += p->flops;
            weights += p->weight_mib;
        }
        if (o->decode)
            printf("   decode: %.3f ms per step (the slowest rank's median) = %.1f tokens/s; packed weights %.1f "
                   "MiB over %d ranks\n",
                   slowest, (double)o->batch / (slowest * 1e-3), weights, world);
        else
            printf("   forward: %.3f ms (the slowest rank's median over %d runs) = %.1f GFLOP/s over %d ranks; "
                   "packed weights %.1f MiB in all\n",
                   slowest, o->repeat, flops / (slowest * 1e6), world, weights);
        fflush(stdout);
    }
    free(all);
    return any_failed;
}

int run_tp(int *argc, char ***argv, const char *const *archs, int arch_count, const struct run_options *o)
{
    int provided = 0, rank = 0, world = 1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "sneppx-run: --tp: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int failures = 0;
    for (int a = 0; a < arch_count; a++)
        failures += run_tp_arch(archs[a], o, rank, world);
    MPI_Finalize();
    return failures;
}
