/* Runs a decode baseline script as a server whose steps the bench times in its
 * own rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"
#include "decode_baselines.h"

#define MAX_EXTRA_ARGS 8

/* A baseline's command line: the venv's python, the script and config's shape on
 * `threads` threads (then the caller's arguments), and the environment it runs in. */
struct baseline_command {
    char python[512], path[512], hidden[32], heads[32], kv_heads[32], head_dim[32], theta[48], threads[16],
        omp_threads[48];
    char *argv[32 + MAX_EXTRA_ARGS];
    int argc;
    const char *set_env[3];
};

/* Fills command, extra_args (NULL-terminated, or NULL) after the shape, or returns -1
 * with why in skipped (no virtual environment). */
static int baseline_command(const char *script, const sneppx_config *config, int threads,
                            const char *const *extra_args, struct baseline_command *command, char *skipped,
                            size_t skipped_size)
{
    memset(command, 0, sizeof *command);
    const char *venv = getenv("SNEPPX_BENCH_VENV");
    if (!venv || !venv[0]) {
        snprintf(skipped, skipped_size, "no virtual environment (bench/run.sh makes one with "
                                        "scripts/venv.sh; or set SNEPPX_BENCH_VENV)");
        return -1;
    }
    snprintf(command->python, sizeof command->python, "%s/bin/python", venv);
    snprintf(command->path, sizeof command->path, "%s/baselines/%s", SNEPPX_BENCH_SOURCE_DIR, script);
    snprintf(command->hidden, sizeof command->hidden, "%lld", (long long)config->hidden_size);
    snprintf(command->heads, sizeof command->heads, "%lld", (long long)config->num_attention_heads);
    snprintf(command->kv_heads, sizeof command->kv_heads, "%lld", (long long)config->num_key_value_heads);
    /* The config's head_dim when it has one (hidden_size / heads is only the default). */
    snprintf(command->head_dim, sizeof command->head_dim, "%lld",
             (long long)(config->head_dim ? config->head_dim : config->hidden_size / config->num_attention_heads));
    snprintf(command->theta, sizeof command->theta, "%.17g", config->rope_theta);
    snprintf(command->threads, sizeof command->threads, "%d", threads);
    snprintf(command->omp_threads, sizeof command->omp_threads, "OMP_NUM_THREADS=%d", threads);
    char *const shape[] = {command->python, command->path, "--hidden", command->hidden, "--heads", command->heads,
                           "--kv-heads", command->kv_heads, "--head-dim", command->head_dim, "--rope-theta",
                           command->theta, "--threads", command->threads};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        command->argv[command->argc++] = shape[i];
    for (int i = 0; extra_args && i < MAX_EXTRA_ARGS && extra_args[i]; i++)
        command->argv[command->argc++] = (char *)extra_args[i];
    command->argv[command->argc] = NULL;
    /* OpenBLAS's core is the bench's own environment, which it re-executed itself into
     * (main.c): unset, or Haswell's where sneppx runs a narrower target. */
    command->set_env[0] =
        "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295";
    command->set_env[1] = command->omp_threads;
    return 0;
}

/* A served baseline's start-up lines before "ready": its version first, and what
 * its step reads outside attention. */
static void served_start_line(const char *line, void *state)
{
    struct decode_baseline_server *served = state;
    const char *other = bench_child_field(line, "nonattention_bytes");
    if (other)
        served->other_bytes = atof(other);
    else if (!served->version[0])
        snprintf(served->version, sizeof served->version, "%s", line);
}

int decode_baseline_serve(const char *script, const sneppx_config *config, int threads,
                          const char *const *extra_args, struct decode_baseline_server *served)
{
    memset(served, 0, sizeof *served);
    snprintf(served->script, sizeof served->script, "%s", script);
    struct baseline_command command;
    if (baseline_command(script, config, threads, extra_args, &command, served->skipped, sizeof served->skipped) !=
        0)
        return -1;
    if (bench_server_start(command.argv, command.set_env, NULL, &served->server) != 0) {
        snprintf(served->skipped, sizeof served->skipped, "cannot run %.200s", command.python);
        return -1;
    }
    if (bench_server_await_ready(&served->server, script, served_start_line, served, served->skipped,
                                 sizeof served->skipped) != 0) {
        decode_baseline_stop(served);
        return -1;
    }
    served->request_seconds = bench_server_round_trip(&served->server);
    if (served->request_seconds < 0) {
        snprintf(served->skipped, sizeof served->skipped, "%s did not answer a ping", script);
        decode_baseline_stop(served);
        return -1;
    }
    return 0;
}

int decode_baseline_prepare(struct decode_baseline_server *served, int64_t context, int64_t batch)
{
    if (served->skipped[0])
        return -1;
    char request[64], reply[256] = "", expected[64];
    snprintf(request, sizeof request, "context %lld %lld", (long long)context, (long long)batch);
    snprintf(expected, sizeof expected, "ready %lld %lld", (long long)context, (long long)batch);
    if (bench_server_ask(&served->server, request, reply, sizeof reply) == 0 && strcmp(reply, expected) == 0)
        return 0;
    fprintf(stderr, "sneppx-bench: %s, '%s': %s\n", served->script, request, reply[0] ? reply : "no answer");
    return -1;
}

int decode_baseline_step_side(struct decode_baseline_server *served, int64_t context, int64_t batch,
                              void (*after)(void), struct bench_side *side)
{
    if (decode_baseline_prepare(served, context, batch) != 0)
        return -1;
    served->step = (struct bench_request){.server = &served->server, .who = served->script};
    snprintf(served->step.line, sizeof served->step.line, "step");
    *side = (struct bench_side){.body = bench_request_run, .state = &served->step, .after = after};
    return 0;
}

void decode_baseline_stop(struct decode_baseline_server *served)
{
    bench_server_stop(&served->server);
}

void decode_baseline_describe_other_bytes(double other_bytes, char *text, size_t size)
{
    if (other_bytes > 0)
        snprintf(text, size, " (its step also reads %.1f MB outside attention, not subtracted)", other_bytes / 1e6);
    else if (size > 0)
        text[0] = '\0';
}
