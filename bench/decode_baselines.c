/* Runs a decode baseline script and collects its "result" lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"
#include "decode_baselines.h"

#define MAX_EXTRA_ARGS 8

void decode_baseline_run(const char *script, const sneppx_config *config, const int64_t *contexts,
                         int context_count, const int64_t *batches, int batch_count, int threads, int steps,
                         const char *const *extra_args, struct decode_baseline_times *times)
{
    memset(times, 0, sizeof *times);
    const char *venv = getenv("SNEPPX_BENCH_VENV");
    if (!venv || !venv[0]) {
        snprintf(times->skipped, sizeof times->skipped, "no virtual environment (bench/run.sh makes one with "
                                                        "scripts/venv.sh; or set SNEPPX_BENCH_VENV)");
        return;
    }
    char python[512], path[512], hidden[32], heads[32], kv_heads[32], head_dim[32], theta[48], contexts_arg[128],
        batch_arg[16], threads_arg[16], steps_arg[16], omp_threads[48];
    snprintf(python, sizeof python, "%s/bin/python", venv);
    snprintf(path, sizeof path, "%s/baselines/%s", SNEPPX_BENCH_SOURCE_DIR, script);
    snprintf(hidden, sizeof hidden, "%lld", (long long)config->hidden_size);
    snprintf(heads, sizeof heads, "%lld", (long long)config->num_attention_heads);
    snprintf(kv_heads, sizeof kv_heads, "%lld", (long long)config->num_key_value_heads);
    /* The config's head_dim when it has one (hidden_size / heads is only the default). */
    snprintf(head_dim, sizeof head_dim, "%lld",
             (long long)(config->head_dim ? config->head_dim : config->hidden_size / config->num_attention_heads));
    snprintf(theta, sizeof theta, "%.17g", config->rope_theta);
    snprintf(threads_arg, sizeof threads_arg, "%d", threads);
    snprintf(steps_arg, sizeof steps_arg, "%d", steps);
    snprintf(omp_threads, sizeof omp_threads, "OMP_NUM_THREADS=%d", threads);
    for (int b = 0; b < batch_count; b++) {
        snprintf(batch_arg, sizeof batch_arg, "%lld", (long long)batches[b]);
        contexts_arg[0] = 0;
        for (int c = 0; c < context_count; c++) {
            if (batches[b] > 1 && contexts[c] > DECODE_BASELINE_BATCH_MAX_CONTEXT)
                continue;
            char number[32];
            snprintf(number, sizeof number, "%s%lld", contexts_arg[0] ? "," : "", (long long)contexts[c]);
            strncat(contexts_arg, number, sizeof contexts_arg - strlen(contexts_arg) - 1);
        }
        char *argv[26 + MAX_EXTRA_ARGS] = {python, path, "--hidden", hidden, "--heads", heads, "--kv-heads",
                                           kv_heads, "--head-dim", head_dim, "--rope-theta", theta, "--contexts",
                                           contexts_arg, "--batch", batch_arg, "--threads", threads_arg,
                                           "--steps", steps_arg};
        int argc = 20;
        for (int i = 0; extra_args && i < MAX_EXTRA_ARGS && extra_args[i]; i++)
            argv[argc++] = (char *)extra_args[i];
        argv[argc] = NULL;
        const char *const set_env[] = {
            "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295",
            omp_threads, NULL};
        /* OpenBLAS's core is the bench's own environment, which it re-executed itself into
         * (main.c): unset, or Haswell's where sneppx runs a narrower target. */
        struct bench_child child;
        if (bench_child_run(argv, set_env, NULL, &child) != 0) {
            snprintf(times->skipped, sizeof times->skipped, "cannot run %.200s", python);
            return;
        }
        const char *unavailable = bench_child_field(child.output, "unavailable");
        if (unavailable || child.exit_code != 0) {
            if (unavailable)
                snprintf(times->skipped, sizeof times->skipped, "%.*s", (int)strcspn(unavailable, "\n"),
                         unavailable);
            else
                snprintf(times->skipped, sizeof times->skipped, "%s exited with status %d", script, child.exit_code);
            free(child.output);
            return;
        }
        const char *version = strchr(child.output, '\n') ? child.output : "";
        snprintf(times->version, sizeof times->version, "%.*s", (int)strcspn(version, "\n"), version);
        const char *other = bench_child_field(child.output, "nonattention_bytes");
        times->other_bytes = other ? atof(other) : 0;
        for (const char *line = child.output; (line = strstr(line, "result ")) != NULL; line++) {
            long long context, batch;
            int thread_count, reps;
            double median, fastest, slowest;
            if (sscanf(line, "result %lld %lld %d %lf %lf %lf %d", &context, &batch, &thread_count, &median,
                       &fastest, &slowest, &reps) != 7)
                continue;
            for (int c = 0; c < context_count; c++)
                if (contexts[c] == context)
                    times->seconds[c][b] = (struct bench_stats){median, fastest, slowest, reps};
        }
        free(child.output);
    }
}

void decode_baseline_describe_other_bytes(const struct decode_baseline_times *times, char *text, size_t size)
{
    if (times->other_bytes > 0)
        snprintf(text, size, " (its step also reads %.1f MB outside attention, not subtracted)",
                 times->other_bytes / 1e6);
    else if (size > 0)
        text[0] = '\0';
}
