/* The cache blocking a GEMM key carries on this host (runtime/gemm_tiles.h). */
#include "gemm_tiles.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "disk_cache.h"
#include "error.h"
#include "gemm_tuner.h"
#include "tuning_record.h"

#define MAX_TARGETS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int known;                      /* the record was read (or tuned) */
    int tuned;                      /* and holds tiles */
    struct sneppx_gemm_tuning tiles;
} chosen[MAX_TARGETS];

void sneppx_gemm_default_tiles(const struct sneppx_target *target, sneppx_dtype weight_type, int64_t *kc,
                               int64_t *mc)
{
    *kc = target->gemm_kc;
    *mc = weight_type == SNEPPX_DTYPE_INT8 ? target->gemm_int8_mc : target->gemm_mc;
}

/* SNEPPX_TUNE=1: tune a target that has no valid record at first use. */
static int tune_at_first_use(void)
{
    const char *value = getenv("SNEPPX_TUNE");
    if (!value || !value[0] || strcmp(value, "0") == 0)
        return 0;
    if (strcmp(value, "1") == 0)
        return 1;
    sneppx_log(0, "warning: SNEPPX_TUNE='%s' is neither 0 nor 1; not tuning", sneppx_clip(value).text);
    return 0;
}

/* Tunes target and keeps the winner; 0 and a warning when it cannot. */
static int measure_and_keep(const struct sneppx_target *target, struct sneppx_gemm_tuning *tiles)
{
    struct sneppx_gemm_tune_shape shape = sneppx_gemm_tune_default_shape();
    struct sneppx_gemm_tune_result *result = malloc(sizeof *result);
    sneppx_status status = result ? sneppx_gemm_tune(target, &shape, result) : SNEPPX_ERR_OUT_OF_MEMORY;
    if (status != SNEPPX_OK) {
        sneppx_log(0, "warning: SNEPPX_TUNE: tuning the GEMM for %s failed (%s); its defaults apply", target->name,
                   result ? sneppx_last_error() : "out of memory");
        free(result);
        return 0;
    }
    *tiles = result->times[result->winner].tiles;
    sneppx_log(1, "tuned the GEMM for %s in %.0f ms: kc %lld, mc %lld (%.1f GFLOP/s; defaults %.1f)", target->name,
               result->total_ms, (long long)tiles->kc, (long long)tiles->mc, result->times[result->winner].gflops,
               result->defaults >= 0 ? result->times[result->defaults].gflops : 0.0);
    free(result);
    if (sneppx_gemm_tuning_store(target, tiles) != SNEPPX_OK)
        sneppx_log(0, "warning: SNEPPX_TUNE: the GEMM tuning for %s is not kept: %s", target->name,
                   sneppx_last_error());
    return 1;
}

/* measure_and_keep under the record's build lock (disk_cache.h), as processes
 * building one kernel serialize: processes started at once (a service's
 * workers) would each time the candidates while the others load the cores,
 * and keep a winner of disturbed timings, at seconds of compiles and runs
 * each. The process that waited reads the record the first one kept. */
static int tune(const struct sneppx_target *target, struct sneppx_gemm_tuning *tiles)
{
    char key[SNEPPX_KEY_MAX], reason[256];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    const int lock = sneppx_disk_cache_lock(key);
    if (lock >= 0 && sneppx_gemm_tuning_load(target, tiles, reason, sizeof reason) == SNEPPX_TUNING_LOADED) {
        sneppx_disk_cache_unlock(lock);
        sneppx_log(1, "the GEMM for %s was tuned by another process meanwhile: kc %lld, mc %lld", target->name,
                   (long long)tiles->kc, (long long)tiles->mc);
        return 1;
    }
    const int tuned = measure_and_keep(target, tiles);
    sneppx_disk_cache_unlock(lock);
    return tuned;
}

void sneppx_gemm_tiles(const struct sneppx_target *target, sneppx_dtype weight_type, int64_t *kc, int64_t *mc)
{
    sneppx_gemm_default_tiles(target, weight_type, kc, mc);
    const int index = (int)(target - sneppx_targets);
    if (weight_type == SNEPPX_DTYPE_INT8 || index < 0 || index >= sneppx_target_count || index >= MAX_TARGETS)
        return;
    pthread_mutex_lock(&lock);
    if (!chosen[index].known) {
        char reason[256] = "";
        struct sneppx_gemm_tuning tiles;
        const sneppx_tuning_load loaded = sneppx_gemm_tuning_load(target, &tiles, reason, sizeof reason);
        /* Read once: a value that is neither 0 nor 1 is one warning. */
        const int tune_now = loaded != SNEPPX_TUNING_LOADED && tune_at_first_use();
        if (loaded == SNEPPX_TUNING_REFUSED)
            sneppx_log(0, "warning: the GEMM tuning record for %s is ignored (%s); %s", target->name, reason,
                       tune_now ? "tuning again (SNEPPX_TUNE=1)" : "the target's defaults apply");
        if (loaded == SNEPPX_TUNING_LOADED)
            chosen[index].tuned = 1;
        else if (tune_now)
            chosen[index].tuned = tune(target, &tiles);
        chosen[index].tiles = tiles;
        chosen[index].known = 1;
        if (chosen[index].tuned)
            sneppx_log(2, "GEMM tiles for %s: kc %lld, mc %lld (tuned)", target->name, (long long)tiles.kc,
                       (long long)tiles.mc);
    }
    if (chosen[index].tuned) {
        *kc = chosen[index].tiles.kc;
        *mc = chosen[index].tiles.mc;
    }
    pthread_mutex_unlock(&lock);
}

void sneppx_gemm_tiles_reset(void)
{
    memset(chosen, 0, sizeof chosen);
}
