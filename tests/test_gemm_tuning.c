/* Tuning the GEMM per host (runtime/gemm_tuner.h, tuning_record.h, gemm_tiles.h):
 * - the tuner times every kc x mc candidate of the host's target once and picks
 *   one of them (the defaults unless a candidate beats them);
 * - a record kept in the disk cache gives float32 and 16-bit GEMM keys its kc and
 *   mc (int8 keeps the target's), so a tuned and an untuned kernel have different
 *   keys, and a layer made then asks for the tuned keys;
 * - a tuned kernel computes what the untuned one does: both against the float64
 *   reference (tests/support's ref_linear) within float32 tolerance, on a shape
 *   with partial k slices, blocks, row groups and panels;
 * - a record that is corrupt, foreign, or whose text is not a candidate is
 *   ignored with a message naming why, and the target's defaults apply;
 * - SNEPPX_TUNE=1 without a valid record tunes at the first layer and keeps the
 *   record its keys carry; another value than 0 or 1 is one warning;
 * - two such processes started at once tune once: the other waits on the
 *   record's lock and takes the record kept. */
#include "test_cache_common.h"

#include <pthread.h>

#include "disk_cache.h"
#include "gemm_tiles.h"
#include "gemm_tuner.h"
#include "host.h"
#include "mha_reference.h"
#include "sneppx/layer.h"
#include "tuning_record.h"

#define ROWS 100
#define K 700
#define N 200

static test_tally tally;

/* The first candidate pair that is not the target's defaults. */
static struct sneppx_gemm_tuning other_tiles(const struct sneppx_target *target)
{
    for (int i = 0; i < target->gemm_kc_candidate_count; i++)
        for (int j = 0; j < target->gemm_mc_candidate_count; j++)
            if (target->gemm_kc_candidates[i] != target->gemm_kc || target->gemm_mc_candidates[j] != target->gemm_mc)
                return (struct sneppx_gemm_tuning){target->gemm_kc_candidates[i], target->gemm_mc_candidates[j]};
    return (struct sneppx_gemm_tuning){target->gemm_kc, target->gemm_mc};
}

static int is_default(const struct sneppx_target *target, sneppx_dtype type)
{
    int64_t kc, mc, want_kc, want_mc;
    sneppx_gemm_tiles(target, type, &kc, &mc);
    sneppx_gemm_default_tiles(target, type, &want_kc, &want_mc);
    return kc == want_kc && mc == want_mc;
}

static void check_tuner(const struct sneppx_target *target)
{
    struct sneppx_gemm_tune_shape shape = {.rows = 64, .k = 256, .n = 128, .threads = 1, .rounds = 3};
    struct sneppx_gemm_tune_result result;
    sneppx_status status = sneppx_gemm_tune(target, &shape, &result);
    if (!TEST_CHECK(&tally, status == SNEPPX_OK, "tune: %s", sneppx_last_error()))
        return;
    TEST_CHECK(&tally, result.count == target->gemm_kc_candidate_count * target->gemm_mc_candidate_count,
               "%d candidates timed, want every kc with every mc", result.count);
    for (int i = 0; i < result.count; i++) {
        const struct sneppx_gemm_tune_time *t = &result.times[i];
        const int kc = target->gemm_kc_candidates[i / target->gemm_mc_candidate_count];
        const int mc = target->gemm_mc_candidates[i % target->gemm_mc_candidate_count];
        TEST_CHECK(&tally, t->tiles.kc == kc && t->tiles.mc == mc && t->ms > 0 && isfinite(t->gflops),
                   "candidate %d: kc %lld mc %lld (want %d, %d), %.3f ms", i, (long long)t->tiles.kc,
                   (long long)t->tiles.mc, kc, mc, t->ms);
    }
    TEST_CHECK(&tally, result.defaults >= 0 && result.times[result.defaults].tiles.kc == target->gemm_kc &&
                           result.times[result.defaults].tiles.mc == target->gemm_mc,
               "the defaults are candidate %d", result.defaults);
    if (result.winner != result.defaults)
        TEST_CHECK(&tally, result.times[result.winner].ms * (1 + SNEPPX_TUNE_MIN_GAIN) <=
                                   result.times[result.defaults].ms &&
                               result.times[result.winner].median_ms * (1 + SNEPPX_TUNE_MIN_GAIN) <=
                                   result.times[result.defaults].median_ms,
                   "a winner other than the defaults beats them by %g, fastest and median rounds",
                   SNEPPX_TUNE_MIN_GAIN);
    for (int i = 0; i < result.count; i++)
        TEST_CHECK(&tally, result.times[i].median_ms >= result.times[i].ms && result.times[i].ms > 0,
                   "candidate %d: median round %.3f ms, fastest %.3f ms", i, result.times[i].median_ms,
                   result.times[i].ms);

    shape.rounds = 0;
    status = sneppx_gemm_tune(target, &shape, &result);
    TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "rounds 0"),
               "rounds 0: %s", sneppx_last_error());
}

/* The selection rule on made-up times (ms = fastest round, median_ms), candidate 0
 * the defaults at 100 / 100 ms unless said otherwise. */
static void check_winner_rule(void)
{
    struct sneppx_gemm_tune_time t[4] = {{.ms = 100, .median_ms = 100}};
    /* Zen 5's table: the fastest round (1) fails the median; another (2) beats both. */
    t[1] = (struct sneppx_gemm_tune_time){.ms = 95.5, .median_ms = 101.5};
    t[2] = (struct sneppx_gemm_tune_time){.ms = 96.1, .median_ms = 96.4};
    t[3] = (struct sneppx_gemm_tune_time){.ms = 99.5, .median_ms = 95.0};
    TEST_CHECK(&tally, sneppx_gemm_tune_winner(t, 4, 0) == 2, "a candidate beating both rounds wins over the fastest "
               "round that fails its median, and over a 0.5%% fastest round: %d", sneppx_gemm_tune_winner(t, 4, 0));
    t[3] = (struct sneppx_gemm_tune_time){.ms = 98.9, .median_ms = 95.0};
    TEST_CHECK(&tally, sneppx_gemm_tune_winner(t, 4, 0) == 3, "of two that beat both, the faster median wins: %d",
               sneppx_gemm_tune_winner(t, 4, 0));
    t[2].median_ms = t[3].median_ms = 99.2;
    TEST_CHECK(&tally, sneppx_gemm_tune_winner(t, 4, 0) == 0, "gains under %g on the median keep the defaults: %d",
               SNEPPX_TUNE_MIN_GAIN, sneppx_gemm_tune_winner(t, 4, 0));
    TEST_CHECK(&tally, sneppx_gemm_tune_winner(t, 4, 1) == 1 && sneppx_gemm_tune_winner(t, 1, 0) == 0,
               "defaults elsewhere or alone: %d, %d", sneppx_gemm_tune_winner(t, 4, 1), sneppx_gemm_tune_winner(t, 1, 0));
    TEST_CHECK(&tally, sneppx_gemm_tune_winner(t, 4, -1) == 2 && sneppx_gemm_tune_winner(t, 0, -1) == -1,
               "no defaults: the fastest median (ties: the fastest round): %d; none: %d",
               sneppx_gemm_tune_winner(t, 4, -1), sneppx_gemm_tune_winner(t, 0, -1));
}

/* out = src x W^T + bias with kc and mc on the host's target. */
static const sneppx_kernel *run_gemm(const struct sneppx_target *target, int64_t kc, int64_t mc, const float *src,
                                     const float *weight, const float *bias, float *out)
{
    const int64_t values[] = {K, N, 1, SNEPPX_DTYPE_FLOAT32, kc, mc};
    const sneppx_kernel *kernel;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", values, target, &kernel) == SNEPPX_OK, "kc %lld mc %lld: %s",
                    (long long)kc, (long long)mc, sneppx_last_error()))
        return NULL;
    float *packed = aligned_alloc(64, (size_t)sneppx_gemm_packed_floats(K, N, target->gemm_nr) * sizeof(float));
    struct sneppx_args pack = {.struct_size = sizeof pack, .abi_version = SNEPPX_ABI_VERSION, .col_end = N,
                               .src = weight, .src_stride = K, .dst = packed};
    kernel->entry[SNEPPX_ENTRY_PACK](&pack);
    /* Two tasks of rows, as the runtime cuts them (whole MR-row tiles but the last). */
    const int64_t split = (ROWS / 2 + target->gemm_mr - 1) / target->gemm_mr * target->gemm_mr;
    for (int64_t r0 = 0; r0 < ROWS; r0 += split) {
        struct sneppx_args args = {.struct_size = sizeof args, .abi_version = SNEPPX_ABI_VERSION, .row_begin = r0,
                                   .row_end = r0 + split < ROWS ? r0 + split : ROWS, .col_end = N, .src = src,
                                   .src_stride = K, .weight = packed, .bias = bias, .dst = out, .dst_stride = N};
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
    free(packed);
    return kernel;
}

static void check_numerics(const struct sneppx_target *target, const struct sneppx_gemm_tuning *tuned)
{
    static float src[ROWS * K], weight[N * K], bias[N], got_tuned[ROWS * N], got_untuned[ROWS * N];
    static double in[ROWS * K], want[ROWS * N];
    test_rng rng = test_rng_seeded(20);
    test_fill_uniform(&rng, src, ROWS * K, 1.0f);
    test_fill_uniform(&rng, weight, N * K, 0.05f);
    test_fill_uniform(&rng, bias, N, 0.5f);
    for (int64_t i = 0; i < ROWS * K; i++)
        in[i] = src[i];
    ref_linear(in, ROWS, K, weight, bias, N, want);
    const sneppx_kernel *a = run_gemm(target, tuned->kc, tuned->mc, src, weight, bias, got_tuned);
    const sneppx_kernel *b = run_gemm(target, target->gemm_kc, target->gemm_mc, src, weight, bias, got_untuned);
    if (!a || !b)
        return;
    TEST_CHECK(&tally, strcmp(a->key, b->key) != 0, "tuned and untuned keys differ: %s, %s", a->key, b->key);
    const test_error tuned_error = test_compare(got_tuned, want, ROWS * N);
    const test_error untuned_error = test_compare(got_untuned, want, ROWS * N);
    const test_error between = test_compare_float(got_tuned, got_untuned, ROWS * N);
    TEST_CHECK(&tally, test_error_within(&tuned_error, 1e-5, 1e-6), "%s against float64: max %.3g, rms %.3g",
               a->key, tuned_error.max_normalized, tuned_error.rms_relative);
    TEST_CHECK(&tally, test_error_within(&untuned_error, 1e-5, 1e-6), "%s against float64: max %.3g, rms %.3g",
               b->key, untuned_error.max_normalized, untuned_error.rms_relative);
    TEST_CHECK(&tally, test_error_within(&between, 1e-5, 1e-6), "tuned against untuned: max %.3g, rms %.3g",
               between.max_normalized, between.rms_relative);
    printf("%s: %.2g, %s: %.2g against float64\n", a->key, tuned_error.max_normalized, b->key,
           untuned_error.max_normalized);
}

/* The small layer whose GEMM keys the tests look at. */
static void small_layer_config(sneppx_config *config)
{
    sneppx_config_init(config);
    config->hidden_size = 128;
    config->num_attention_heads = 2;
    config->num_key_value_heads = 1;
    config->head_dim = 64;
    config->max_position_embeddings = 64;
}

/* The part of a GEMM key that names tiles. */
static void tiles_suffix(const struct sneppx_gemm_tuning *tiles, char suffix[64])
{
    snprintf(suffix, 64, "-kc%lld-mc%lld-", (long long)tiles->kc, (long long)tiles->mc);
}

/* A layer made with the record in place asks for the tuned GEMM keys. */
static void check_layer_keys(const struct sneppx_gemm_tuning *tuned)
{
    sneppx_config config;
    small_layer_config(&config);
    config.num_threads = 1;
    sneppx_layer *layer;
    if (!TEST_CHECK(&tally, sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK, "layer: %s",
                    sneppx_last_error()))
        return;
    char suffix[64];
    tiles_suffix(tuned, suffix);
    TEST_CHECK(&tally, strstr(sneppx_layer_keys(layer), suffix) != NULL, "layer keys have %s:\n%s", suffix,
               sneppx_layer_keys(layer));
    sneppx_layer_destroy(layer);
}

static void record_path(const char *dir, const struct sneppx_target *target, char *path, size_t size)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    cache_test_entry_path(dir, key, path, size);
}

/* The record's verdict contains `reason`; the tiles fall back to the defaults. */
static void check_refused(const struct sneppx_target *target, const char *what, const char *reason)
{
    struct sneppx_gemm_tuning tiles;
    char why[256] = "";
    const sneppx_tuning_load loaded = sneppx_gemm_tuning_load(target, &tiles, why, sizeof why);
    TEST_CHECK(&tally, loaded == SNEPPX_TUNING_REFUSED && strstr(why, reason), "%s: verdict %d '%s', want '%s'",
               what, (int)loaded, why, reason);
    sneppx_gemm_tiles_reset();
    TEST_CHECK(&tally, is_default(target, SNEPPX_DTYPE_FLOAT32), "%s: the defaults apply", what);
}

/* Stores text as the record's payload under fingerprint (NULL: the right one). */
static void plant(const struct sneppx_target *target, const char *text, const uint8_t *fingerprint)
{
    char key[SNEPPX_KEY_MAX];
    uint8_t right[SNEPPX_SHA256_SIZE];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    sneppx_tuning_fingerprint(key, right);
    int evicted;
    sneppx_disk_cache_store(key, fingerprint ? fingerprint : right, text, strlen(text), &evicted);
}

static int child_tiles_after_corruption(void)
{
    return is_default(sneppx_host_target(), SNEPPX_DTYPE_FLOAT32) ? 0 : 1;
}

/* SNEPPX_TUNE=1 and no valid record: the first layer tunes, keeps the winner as the
 * record, and asks for its keys. Exit 0 when the record loads and the layer's keys
 * carry its tiles. */
static int child_tune_at_first_use(void)
{
    sneppx_config config;
    small_layer_config(&config);
    sneppx_layer *layer = NULL;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "layer: %s\n", sneppx_last_error());
        return 1;
    }
    struct sneppx_gemm_tuning tiles;
    char why[256] = "";
    const int loaded = sneppx_gemm_tuning_load(sneppx_host_target(), &tiles, why, sizeof why) == SNEPPX_TUNING_LOADED;
    char suffix[64];
    tiles_suffix(&tiles, suffix);
    const int keyed = loaded && strstr(sneppx_layer_keys(layer), suffix) != NULL;
    fprintf(stderr, "record %s (%s); keys:\n%s", loaded ? "loaded" : "not loaded", why, sneppx_layer_keys(layer));
    sneppx_layer_destroy(layer);
    return keyed ? 0 : 1;
}

struct tune_child {
    int code;
    char *output;
};

static void *run_tune_child(void *context)
{
    struct tune_child *child = context;
    /* A wait long enough for the other's tuning on a loaded machine. */
    const char *env[] = {"SNEPPX_TUNE=1", "SNEPPX_VERBOSE=1", "SNEPPX_CACHE_LOCK_TIMEOUT=600", NULL};
    child->code = cache_test_run_child("child-tune", env, &child->output);
    return NULL;
}

/* Two processes with SNEPPX_TUNE=1 and no record, started at once: one tunes and
 * the other takes the record it kept, each layer asking for the record's keys
 * (side by side, each would time its candidates while the other loads the cores). */
static void check_concurrent_tuning(const char *dir, const struct sneppx_target *target)
{
    char path[CACHE_TEST_PATH_MAX];
    record_path(dir, target, path, sizeof path);
    unlink(path);
    struct tune_child children[2] = {{0}};
    pthread_t threads[2];
    int started = 0;
    while (started < 2 && pthread_create(&threads[started], NULL, run_tune_child, &children[started]) == 0)
        started++;
    int tunings = 0, exits = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        tunings += cache_test_count(children[i].output, "tuned the GEMM for ");
        exits += children[i].code == 0;
    }
    TEST_CHECK(&tally, started == 2 && exits == 2 && tunings == 1,
               "two SNEPPX_TUNE=1 processes at once: %d started, %d exited 0, %d tuned (want 1); stderr:\n%s\n---\n%s",
               started, exits, tunings, children[0].output ? children[0].output : "",
               children[1].output ? children[1].output : "");
    free(children[0].output);
    free(children[1].output);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "child-tiles") == 0)
        return child_tiles_after_corruption();
    if (argc == 2 && strcmp(argv[1], "child-tune") == 0)
        return child_tune_at_first_use();
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "tuning") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_TUNE");
    unsetenv("SNEPPX_JIT");
    const struct sneppx_target *target = sneppx_host_target();
    check_winner_rule();

    /* No record: the defaults. */
    TEST_CHECK(&tally, is_default(target, SNEPPX_DTYPE_FLOAT32) && is_default(target, SNEPPX_DTYPE_INT8),
               "without a record the target's defaults apply");
    check_tuner(target);

    /* A kept record: float32 and 16-bit keys take it, int8 keys the target's block. */
    const struct sneppx_gemm_tuning tuned = other_tiles(target);
    TEST_CHECK(&tally, sneppx_gemm_tuning_store(target, &tuned) == SNEPPX_OK, "store: %s", sneppx_last_error());
    sneppx_gemm_tiles_reset();
    int64_t kc, mc;
    sneppx_gemm_tiles(target, SNEPPX_DTYPE_BFLOAT16, &kc, &mc);
    TEST_CHECK(&tally, kc == tuned.kc && mc == tuned.mc, "bfloat16: kc %lld mc %lld, want the record's %lld, %lld",
               (long long)kc, (long long)mc, (long long)tuned.kc, (long long)tuned.mc);
    TEST_CHECK(&tally, is_default(target, SNEPPX_DTYPE_INT8), "int8 keeps the target's block");
    check_numerics(target, &tuned);
    check_layer_keys(&tuned);

    const struct sneppx_gemm_tuning stranger = {100, tuned.mc};
    sneppx_status status = sneppx_gemm_tuning_store(target, &stranger);
    TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "kc 100 is not among"),
               "storing kc 100: %s", sneppx_last_error());

    /* Corrupt: one byte of the text flipped. */
    char path[CACHE_TEST_PATH_MAX];
    record_path(dir, target, path, sizeof path);
    FILE *file = fopen(path, "r+b");
    if (TEST_CHECK(&tally, file && fseek(file, -2, SEEK_END) == 0 && fputc('7', file) != EOF, "%s", path))
        fclose(file);
    check_refused(target, "a corrupt record", "payload SHA-256 differs (corrupted)");
    const char *child_env[] = {"SNEPPX_VERBOSE=0", NULL};
    char *child_stderr = NULL;
    int code = cache_test_run_child("child-tiles", child_env, &child_stderr);
    char message[256];
    snprintf(message, sizeof message, "the GEMM tuning record for %s is ignored (payload SHA-256 differs (corrupted));"
             " the target's defaults apply", target->name);
    TEST_CHECK(&tally, code == 0 && child_stderr && strstr(child_stderr, message),
               "a process finding the corrupt record: exit %d, stderr '%s', want '%s'", code,
               child_stderr ? child_stderr : "", message);
    free(child_stderr);

    /* Verified, but not this host's or build's; or its text is no candidate or no record. */
    const uint8_t foreign[SNEPPX_SHA256_SIZE] = {1};
    plant(target, "kc=128 mc=14\n", foreign);
    check_refused(target, "a foreign record", "fingerprint differs");
    plant(target, "kc=100 mc=14\n", NULL);
    check_refused(target, "kc 100", "kc 100 is not among target");
    plant(target, "kc=0128 mc=14\n", NULL);
    check_refused(target, "a leading zero", "its text is not kc=<k slice> mc=<block rows>");
    plant(target, "kc=128 mc=14", NULL);
    check_refused(target, "no newline", "its text is not kc=<k slice> mc=<block rows>");

    /* SNEPPX_TUNE another value than 0 or 1: one warning naming it (not one per reading),
     * the defaults, nothing tuned or written. */
    const char *bad_tune_env[] = {"SNEPPX_TUNE=yes", "SNEPPX_VERBOSE=0", NULL};
    code = cache_test_run_child("child-tiles", bad_tune_env, &child_stderr);
    TEST_CHECK(&tally, code == 0 && child_stderr &&
                           cache_test_count(child_stderr, "SNEPPX_TUNE='yes' is neither 0 nor 1; not tuning") == 1,
               "SNEPPX_TUNE=yes beside a refused record: exit %d, stderr '%s'", code, child_stderr ? child_stderr : "");
    free(child_stderr);
    check_refused(target, "the record after SNEPPX_TUNE=yes", "its text is not kc=<k slice> mc=<block rows>");
    /* SNEPPX_TUNE=1 beside the refused record: tuned again, at the first layer, and kept. */
    const char *tune_env[] = {"SNEPPX_TUNE=1", "SNEPPX_VERBOSE=0", NULL};
    code = cache_test_run_child("child-tune", tune_env, &child_stderr);
    snprintf(message, sizeof message, "the GEMM tuning record for %s is ignored (its text is not kc=<k slice> "
             "mc=<block rows>", target->name);
    TEST_CHECK(&tally, code == 0 && child_stderr && strstr(child_stderr, message) &&
                           strstr(child_stderr, "tuning again (SNEPPX_TUNE=1)"),
               "SNEPPX_TUNE=1 beside a refused record: exit %d, stderr '%s'", code, child_stderr ? child_stderr : "");
    free(child_stderr);
    check_concurrent_tuning(dir, target);

    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
