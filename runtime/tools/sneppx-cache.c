/* sneppx-cache: shows, lists, clears and warms the kernel disk cache.
 *
 *   sneppx-cache show                   directory, size, bound, host
 *   sneppx-cache list                   one line per entry: key, bytes, last use, verdict
 *   sneppx-cache clear                  removes every entry
 *   sneppx-cache warmup --arch NAME...  compiles (or loads) every kernel of the
 *                                       presets' layers; --all for every preset;
 *                      --config PATH    a checkpoint's config.json (or its directory)
 *   sneppx-cache tune [--threads N]     times the host target's GEMM tile candidates
 *                                       and keeps the winner (runtime/gemm_tuner.h)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "disk_cache.h"
#include "error.h"
#include "fingerprint.h"
#include "gemm_tuner.h"
#include "host.h"
#include "jit.h"
#include "kernel_registry.h"
#include "kernels.h"
#include "object_bundle.h"
#include "sneppx/cache.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "tuning_record.h"

static void usage(FILE *out)
{
    fputs("usage: sneppx-cache show | list | clear | warmup (--arch NAME | --config PATH)... | warmup --all\n"
          "       | tune [--threads N]\n"
          "  show    the cache directory, its size and bound, and the host it compiles for\n"
          "  list    every entry: key, bytes, last use, and whether this build would load it\n"
          "  clear   remove every entry\n"
          "  warmup  compile (or verify) every kernel of the named presets' layers, or of the layer a\n"
          "          checkpoint's config.json (PATH: the file or its directory) describes\n"
          "  tune    time the GEMM's tile candidates on this host (a few seconds) and keep the fastest in\n"
          "          the cache: kernels compiled from then on use it (N threads: OpenMP's default)\n"
          "Environment: SNEPPX_CACHE_DIR, SNEPPX_CACHE_MAX_MB, SNEPPX_CACHE_LOCK_TIMEOUT, SNEPPX_TARGET, SNEPPX_TUNE,\n"
          "SNEPPX_JIT, SNEPPX_VERBOSE\n"
          "(see sneppx/cache.h).\n",
          out);
}

/* what may be the user's text (a preset name, a path): clipped as the library clips it,
 * and left out when empty (the message names the empty argument itself). */
static int fail(const char *what, sneppx_status status)
{
    fprintf(stderr, "sneppx-cache: %s%s%s: %s\n", sneppx_clip(what).text, what[0] ? ": " : "",
            sneppx_status_name(status), sneppx_last_error());
    return 1;
}

/* The target of a key that is not this process's target (SNEPPX_TARGET=v8 on an
 * AVX-512 host, or the reverse), else NULL: such an entry is kept for the processes
 * that run its target, and only they can compute its fingerprint. */
static const char *other_target(const char *key)
{
    const char *dash = strrchr(key, '-');
    return dash && strcmp(dash + 1, sneppx_host_target()->name) != 0 ? dash + 1 : NULL;
}

/* Why this build would not load the entry of key (a kernel or a tuning record),
 * or NULL when it would; *record says which it is. A kernel's payload must also
 * be an object bundle: an entry that verifies but does not unpack is rebuilt at
 * its next use. A record must hold a candidate pair, as its load checks. */
static const char *verdict(const char *key, int *record, char *reason, size_t reason_size)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    *record = 0;
    /* The entry may go between the listing and this look (another process's clear or eviction). */
    snprintf(reason, reason_size, "removed while listing");
    if (sneppx_kernel_fingerprint(key, fingerprint) != SNEPPX_OK) {
        if (sneppx_tuning_fingerprint(key, fingerprint) != SNEPPX_OK) {
            snprintf(reason, reason_size, "no such kernel in this build");
            return reason;
        }
        *record = 1;
        return sneppx_tuning_record_verify(key, reason, reason_size) == SNEPPX_TUNING_LOADED ? NULL : reason;
    }
    void *payload = NULL;
    size_t payload_size = 0;
    if (sneppx_disk_cache_verify(key, fingerprint, &payload, &payload_size, reason, reason_size) != SNEPPX_DISK_HIT)
        return reason;
    struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
    int count = 0;
    const int unpacks = sneppx_bundle_unpack(payload, payload_size, key, objects, &count) == SNEPPX_OK;
    free(payload);
    if (unpacks)
        return NULL;
    snprintf(reason, reason_size, "its payload is no object bundle (rebuilt at its next use)");
    return reason;
}

static int show(void)
{
    const sneppx_host *host = sneppx_host_info();
    const char *dir = sneppx_disk_cache_path();
    printf("directory   %s%s\n", dir ? dir : "(none: memory-only)",
           sneppx_disk_cache_read_only() ? " (read-only: entries are loaded, nothing is written)" : "");
    if (dir) {
        sneppx_disk_entry *entries;
        size_t count;
        sneppx_status status = sneppx_disk_cache_list(&entries, &count);
        if (status != SNEPPX_OK)
            return fail("list", status);
        uint64_t bytes = 0;
        size_t loadable = 0;
        char reason[160];
        int record;
        for (size_t i = 0; i < count; i++) {
            bytes += entries[i].bytes;
            loadable += verdict(entries[i].key, &record, reason, sizeof reason) == NULL;
        }
        free(entries);
        size_t temp_count;
        uint64_t temp_bytes;
        if ((status = sneppx_disk_cache_temp_files(&temp_count, &temp_bytes)) != SNEPPX_OK)
            return fail("list", status);
        uint64_t bound = sneppx_disk_cache_max_bytes();
        printf("entries     %zu (%zu loadable by this build)\n", count, loadable);
        printf("temporary   %zu file%s of %.2f MiB (stores in progress, or left by writers that died: a later"
               " store removes those dated 10 minutes or more from now)\n",
               temp_count, temp_count == 1 ? "" : "s", (double)temp_bytes / (1 << 20));
        printf("size        %.2f MiB (entries and temporary files, as the bound counts them)\n",
               (double)(bytes + temp_bytes) / (1 << 20));
        if (bound >= 1 << 20) {
            /* As set: a bound of 2.5 MiB is not "2 MiB", nor 10^6 MiB "1e+06 MiB". */
            char mib[64];
            snprintf(mib, sizeof mib, "%.6f", (double)bound / (1 << 20));
            char *end = mib + strlen(mib);
            while (end[-1] == '0')
                *--end = '\0';
            if (end[-1] == '.')
                end[-1] = '\0';
            printf("bound       %s MiB (SNEPPX_CACHE_MAX_MB), least recently used evicted\n", mib);
        }
        else if (bound)
            printf("bound       %llu bytes (SNEPPX_CACHE_MAX_MB), least recently used evicted\n",
                   (unsigned long long)bound);
        else
            printf("bound       none (SNEPPX_CACHE_MAX_MB=0)\n");
    }
    printf("host        %s, cpu %s, vector width %d\n", host->triple, host->cpu, host->target->vector_width);
    printf("compile     %s\n", sneppx_jit_options());
    printf("passes     ");
    for (int i = 0; i < sneppx_kernel_family_count; i++)
        printf(" %s: %s%s", sneppx_kernel_families[i].family, sneppx_kernel_families[i].jit_pipeline_summary,
               i + 1 < sneppx_kernel_family_count ? ";" : "\n");
    return 0;
}

static int list(void)
{
    if (!sneppx_disk_cache_path()) {
        fprintf(stderr, "sneppx-cache: no disk cache (memory-only)\n");
        return 0;
    }
    sneppx_disk_entry *entries;
    size_t count;
    sneppx_status status = sneppx_disk_cache_list(&entries, &count);
    if (status != SNEPPX_OK)
        return fail("list", status);
    printf("%-52s %9s  %-19s  %s\n", "KEY", "BYTES", "LAST USED", "VERDICT");
    for (size_t i = 0; i < count; i++) {
        char when[32], reason[160];
        sneppx_disk_cache_format_time(entries[i].last_used, when, sizeof when);
        const char *target = other_target(entries[i].key);
        if (target)
            snprintf(reason, sizeof reason, "SNEPPX_TARGET=%s's entry (checked under it)", target);
        int record = 0;
        const char *problem = target ? NULL : verdict(entries[i].key, &record, reason, sizeof reason);
        /* A refused kernel is compiled again; a refused record is only ignored (the defaults apply). */
        const char *fate = record ? "ignored on next use: " : "rebuilt on next use: ";
        printf("%-52s %9llu  %-19s  %s%s\n", entries[i].key, (unsigned long long)entries[i].bytes, when,
               target ? reason : problem ? fate : "ok", problem ? problem : "");
    }
    free(entries);
    return 0;
}

/* How a checkpoint's line is labelled: its directory's name (the last component
 * of PATH, or of PATH less a final config.json). */
static void checkpoint_label(const char *path, char *label, size_t size)
{
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/')
        end--;
    static const char file[] = "/config.json";
    if (end >= sizeof file - 1 && strncmp(path + end - (sizeof file - 1), file, sizeof file - 1) == 0)
        end -= sizeof file - 1;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/')
        start--;
    snprintf(label, size, "%.*s", (int)(end - start), path + start);
}

/* name: a preset's, or with from_file a config.json or checkpoint directory. */
static int warmup_one(const char *name, int from_file)
{
    char label[256];
    if (from_file)
        checkpoint_label(name, label, sizeof label);
    else
        snprintf(label, sizeof label, "%s", name);
    sneppx_config config;
    sneppx_status status =
        from_file ? sneppx_config_from_json_file(name, &config) : sneppx_config_from_name(name, NULL, &config);
    if (status != SNEPPX_OK)
        return fail(label, status);
    sneppx_jit_stats before, after;
    sneppx_jit_stats_get(&before);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    status = sneppx_layer_warmup(&config);
    clock_gettime(CLOCK_MONOTONIC, &end);
    if (status != SNEPPX_OK)
        return fail(label, status);
    sneppx_jit_stats_get(&after);
    double ms = (double)(end.tv_sec - start.tv_sec) * 1e3 + (double)(end.tv_nsec - start.tv_nsec) * 1e-6;
    printf("%-20s %3llu compiled (%.0f ms), %3llu loaded from disk, %3llu already in memory, %.0f ms\n",
           sneppx_clip(label).text,
           (unsigned long long)(after.compiles - before.compiles), after.compile_ms_total - before.compile_ms_total,
           (unsigned long long)(after.disk_hits - before.disk_hits),
           (unsigned long long)(after.memory_hits - before.memory_hits), ms);
    return 0;
}

/* The arguments are all checked (pass 0) before anything compiles (pass 1): a
 * mistake at the end of the line must not come after minutes of work. */
static int warmup(int argc, char **argv)
{
    int names = 0, failures = 0;
    for (int run = 0; run < 2; run++) {
        names = 0;
        for (int i = 0; i < argc; i++) {
            if (strcmp(argv[i], "--all") == 0) {
                for (int p = 0; p < sneppx_preset_count(); p++, names++)
                    failures += run ? warmup_one(sneppx_preset_name(p), 0) : 0;
            } else if ((strcmp(argv[i], "--arch") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < argc) {
                const int from_file = argv[i][2] == 'c';
                i++;
                sneppx_config config;
                sneppx_status status;
                if (!run && !from_file && (status = sneppx_config_from_name(argv[i], NULL, &config)) != SNEPPX_OK) {
                    fail(argv[i], status); /* as warmup_one says it, but before anything compiles */
                    return 2;
                }
                if (!run && from_file && (status = sneppx_config_from_json_file(argv[i], &config)) != SNEPPX_OK) {
                    char label[256];
                    checkpoint_label(argv[i], label, sizeof label);
                    return fail(label, status); /* a file that cannot be read, or that the runtime refuses */
                }
                failures += run ? warmup_one(argv[i], from_file) : 0;
                names++;
            } else if (strcmp(argv[i], "--arch") == 0 || strcmp(argv[i], "--config") == 0) {
                /* the last argument: "unexpected '--arch'" would call the option unknown */
                fprintf(stderr, "sneppx-cache: warmup: %s needs a %s after it\n", argv[i],
                        argv[i][2] == 'a' ? "preset NAME" : "PATH");
                usage(stderr);
                return 2;
            } else {
                fprintf(stderr, "sneppx-cache: warmup: unexpected '%s'\n", sneppx_clip(argv[i]).text);
                usage(stderr);
                return 2;
            }
        }
        if (names == 0) {
            fprintf(stderr, "sneppx-cache: warmup needs --arch NAME, --config PATH or --all; presets:");
            for (int p = 0; p < sneppx_preset_count(); p++)
                fprintf(stderr, " %s", sneppx_preset_name(p));
            fputc('\n', stderr);
            return 2;
        }
    }
    if (!sneppx_cache_dir()[0])
        fprintf(stderr, "sneppx-cache: warning: no disk cache, nothing was kept\n");
    return failures ? 1 : 0;
}

/* tune's timing and record, while it holds the record's lock (when it could take it). */
static int tune_locked(const struct sneppx_target *target, struct sneppx_gemm_tune_shape shape, const char *key)
{
    struct sneppx_gemm_tune_result *result = malloc(sizeof *result);
    if (!result)
        return fail("tune", SNEPPX_ERR_OUT_OF_MEMORY);
    printf("gemm %s: [%lld, %lld] x [%lld, %lld], best of %d rounds, float32 panels\n", target->name,
           (long long)shape.rows, (long long)shape.k, (long long)shape.k, (long long)shape.n, shape.rounds);
    sneppx_status status = sneppx_gemm_tune(target, &shape, result);
    if (status != SNEPPX_OK) {
        free(result);
        return fail("tune", status);
    }
    printf("%6s %5s %9s %9s %9s %8s\n", "KC", "MC", "MS", "MEDIAN", "GFLOP/S", "VS DEF");
    const double base = result->defaults >= 0 ? result->times[result->defaults].ms : 0;
    for (int i = 0; i < result->count; i++) {
        const struct sneppx_gemm_tune_time *t = &result->times[i];
        printf("%6lld %5lld %9.2f %9.2f %9.1f %7.3fx%s%s\n", (long long)t->tiles.kc, (long long)t->tiles.mc, t->ms,
               t->median_ms, t->gflops, base > 0 ? base / t->ms : 0.0, i == result->defaults ? "  default" : "",
               i == result->winner ? "  <- winner" : "");
    }
    const struct sneppx_gemm_tuning kept = result->times[result->winner].tiles, *winner = &kept;
    printf("winner      kc %lld, mc %lld: %.3fx the defaults (a candidate must gain %.0f%% on its fastest and "
           "median rounds to replace them; of those, the fastest median wins)\n",
           (long long)winner->kc, (long long)winner->mc, base > 0 ? base / result->times[result->winner].ms : 0.0,
           SNEPPX_TUNE_MIN_GAIN * 100);
    printf("time        %.0f ms (%.0f ms resolving %d kernels)\n", result->total_ms, result->compile_ms,
           result->count);
    status = sneppx_gemm_tuning_store(target, winner);
    free(result);
    if (status != SNEPPX_OK)
        return fail("tune", status);
    if (sneppx_cache_dir()[0])
        printf("kept        %s/%s.o: GEMM keys compiled from now on end in -kc%lld-mc%lld-%s\n", sneppx_cache_dir(),
               key, (long long)winner->kc, (long long)winner->mc, target->name);
    else
        fprintf(stderr, "sneppx-cache: warning: no disk cache, nothing was kept\n");
    return 0;
}

/* Times the host target's GEMM candidates, prints each and the winner, keeps it.
 * Under the record's lock, as SNEPPX_TUNE=1 tunes (runtime/gemm_tiles.c): a tune
 * beside another (this tool's or a starting process's) would time candidates on
 * cores the other loads, and keep a winner of disturbed timings. */
static int tune(int argc, char **argv)
{
    struct sneppx_gemm_tune_shape shape = sneppx_gemm_tune_default_shape();
    for (int i = 0; i < argc; i += 2) {
        if (i > 0 && strcmp(argv[i], "--threads") == 0) { /* not the last one silently */
            fprintf(stderr, "sneppx-cache: tune: --threads given twice ('%s' and '%s'); give it once\n",
                    sneppx_clip(argv[1]).text, i + 1 < argc ? sneppx_clip(argv[i + 1]).text : "");
            return 2;
        }
        char *end = NULL;
        long threads = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
        if (strcmp(argv[i], "--threads") != 0 || i + 1 >= argc || !end || *end || end == argv[i + 1] ||
            threads < 0 || threads > 1024) {
            const int option = strcmp(argv[i], "--threads") == 0;
            fprintf(stderr, "sneppx-cache: tune: expected --threads N (0 to 1024), not '%s%s%s'\n",
                    sneppx_clip(argv[i]).text, option ? " " : "", option && i + 1 < argc ? sneppx_clip(argv[i + 1]).text : "");
            return 2;
        }
        shape.threads = (int)threads;
    }
    const struct sneppx_target *target = sneppx_host_target();
    char key[SNEPPX_KEY_MAX];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    const int lock = sneppx_disk_cache_lock(key);
    const int code = tune_locked(target, shape, key);
    sneppx_disk_cache_unlock(lock);
    return code;
}

/* Removes every entry, lock file and temporary file of the cache directory. */
static int clear(void)
{
    sneppx_status status = sneppx_cache_clear();
    if (status != SNEPPX_OK)
        return fail("clear", status);
    printf("cleared %s\n", sneppx_cache_dir()[0] ? sneppx_cache_dir() : "nothing (memory-only)");
    return 0;
}

/* The commands that take no arguments. */
static const struct {
    const char *name;
    int (*run)(void);
} plain_commands[] = {{"show", show}, {"list", list}, {"clear", clear}};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *command = argv[1];
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0 || strcmp(command, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(command, "warmup") == 0)
        return warmup(argc - 2, argv + 2);
    if (strcmp(command, "tune") == 0)
        return tune(argc - 2, argv + 2);
    /* The command is named before its arguments are judged: "takes no arguments"
     * would otherwise call a mistyped command one. */
    for (size_t i = 0; i < sizeof plain_commands / sizeof plain_commands[0]; i++) {
        if (strcmp(command, plain_commands[i].name) != 0)
            continue;
        if (argc > 2) {
            fprintf(stderr, "sneppx-cache: %s takes no arguments, not '%s'\n", command, sneppx_clip(argv[2]).text);
            return 2;
        }
        return plain_commands[i].run();
    }
    fprintf(stderr, "sneppx-cache: unknown command '%s'\n", sneppx_clip(command).text);
    usage(stderr);
    return 2;
}
