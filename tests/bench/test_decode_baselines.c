/* The decode baselines' runner (bench/decode_baselines.c) against a fake
 * virtual environment whose bin/python is a shell script: it prints what
 * decode_llama_cpp.py prints and records the arguments it was given. Checks
 * that the result lines fill the times, that the bytes llama.cpp's step reads
 * outside attention (nonattention_bytes) reach the bench, which says them, that
 * the baseline gets the config's shape, and the bench's OpenBLAS core. Served
 * (--serve, as the generate stage runs them): the start-up lines, a cache asked
 * for and answered, a step as a bench side's body, and a server that is not
 * there or answers an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "decode_baselines.h"

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

/* A venv in a fresh directory whose python writes its arguments to args.txt and
 * runs `body` (sh). */
static int make_venv_script(char *dir, size_t size, const char *body)
{
    char bin[512], python[600];
    snprintf(dir, size, "/tmp/sneppx-decode-baselines-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(bin, sizeof bin, "%s/bin", dir);
    snprintf(python, sizeof python, "%s/python", bin);
    FILE *script = mkdir(bin, 0700) == 0 ? fopen(python, "w") : NULL;
    if (!script)
        return -1;
    fprintf(script, "#!/bin/sh\necho \"$@\" > '%s/args.txt'\necho \"${OPENBLAS_CORETYPE-unset}\" > '%s/env.txt'\n%s\n",
            dir, dir, body);
    fclose(script);
    return chmod(python, 0700);
}

/* A venv whose python prints `output` (printf's escapes) and exits. */
static int make_venv(char *dir, size_t size, const char *output)
{
    char body[1024];
    snprintf(body, sizeof body, "printf '%s'", output);
    return make_venv_script(dir, size, body);
}

/* decode_serve.py's protocol: start-up lines, then an answer per request. */
static const char served_script[] =
    "printf 'llama.cpp fake 0.0\\nnonattention_bytes 5832704\\nready\\n'\n"
    "while read -r request rest; do\n"
    "  case \"$request\" in\n"
    "    ping) echo pong ;;\n"
    "    context) if [ \"$rest\" = '64 3' ]; then echo 'error RuntimeError: no room'; else echo \"ready $rest\"; fi ;;\n"
    "    step) echo 'done 0.001000' ;;\n"
    "    *) echo \"error unknown request $request\" ;;\n"
    "  esac\n"
    "done";

static void remove_venv(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/args.txt", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/env.txt", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/bin/python", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/bin", dir);
    rmdir(path);
    rmdir(dir);
}

static sneppx_config llama3_shape(void)
{
    sneppx_config config;
    memset(&config, 0, sizeof config);
    config.hidden_size = 4096;
    config.num_attention_heads = 32;
    config.num_key_value_heads = 8;
    config.rope_theta = 500000.0;
    return config;
}

static void test_results_and_bytes_outside_attention(void)
{
    char dir[256];
    check(make_venv(dir, sizeof dir,
                    "llama.cpp llama-cpp-python 0.0.0\\nnonattention_bytes 5832704\\n"
                    "result 512 1 2 0.004000 0.003000 0.005000 32\\n") == 0,
          "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    const int64_t context = 512, batch = 1;
    struct decode_baseline_times times;
    decode_baseline_run("decode_llama_cpp.py", &config, &context, 1, &batch, 1, 2, 32, NULL, &times);
    check(times.skipped[0] == 0, "the baseline ran");
    check(strcmp(times.version, "llama.cpp llama-cpp-python 0.0.0") == 0, "its version is the first line");
    const struct bench_stats *s = &times.seconds[0][0];
    check(s->reps == 32 && s->median == 0.004 && s->min == 0.003 && s->max == 0.005, "its result line");
    check(times.other_bytes == 5832704.0, "the bytes its step reads outside attention");
    char text[96];
    decode_baseline_describe_other_bytes(times.other_bytes, text, sizeof text);
    check(strcmp(text, " (its step also reads 5.8 MB outside attention, not subtracted)") == 0,
          "the bench says them");
    remove_venv(dir);
}

static void test_no_bytes_said_prints_nothing(void)
{
    char dir[256];
    check(make_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\nresult 512 1 2 0.01 0.01 0.01 3\\n") == 0,
          "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    const int64_t context = 512, batch = 1;
    struct decode_baseline_times times;
    decode_baseline_run("decode_torch.py", &config, &context, 1, &batch, 1, 2, 3, NULL, &times);
    check(times.other_bytes == 0, "a baseline that says nothing reads nothing more");
    char text[96] = "stale";
    decode_baseline_describe_other_bytes(times.other_bytes, text, sizeof text);
    check(text[0] == 0, "and the bench says nothing");
    remove_venv(dir);
}

/* The first line of what the fake python wrote to dir/name: its arguments (args.txt) or
 * its OPENBLAS_CORETYPE (env.txt). */
static void read_line(const char *dir, const char *name, char *args, size_t size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen(path, "r");
    args[0] = 0;
    if (file) {
        if (!fgets(args, (int)size, file))
            args[0] = 0;
        fclose(file);
    }
}

static void test_the_config_head_dim_is_the_baselines(void)
{
    char dir[256];
    check(make_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    sneppx_config config = llama3_shape();
    config.hidden_size = 2048; /* 64 per head by default, but the config says 128 (as Qwen3's do) */
    config.head_dim = 128;
    const int64_t context = 512, batch = 1;
    struct decode_baseline_times times;
    decode_baseline_run("decode_torch.py", &config, &context, 1, &batch, 1, 2, 3, NULL, &times);
    char args[1024];
    read_line(dir, "args.txt", args, sizeof args);
    check(strstr(args, "--hidden 2048 --heads 32 --kv-heads 8 --head-dim 128 ") != NULL,
          "the baseline runs the config's head_dim, not hidden_size / heads");
    remove_venv(dir);
}

/* Under SNEPPX_TARGET=v8 on an AVX-512 host the bench re-executes itself with OpenBLAS's
 * Haswell core (main.c), so that the baselines' BLAS runs AVX2 code as sneppx does: a
 * baseline inherits it (Debian's torch does its GEMMs on OpenBLAS). */
static void test_the_baseline_keeps_the_benchs_openblas_core(void)
{
    char dir[256];
    check(make_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    const sneppx_config config = llama3_shape();
    const int64_t context = 512, batch = 1;
    struct decode_baseline_times times;
    decode_baseline_run("decode_torch.py", &config, &context, 1, &batch, 1, 2, 3, NULL, &times);
    unsetenv("OPENBLAS_CORETYPE");
    char core[64];
    read_line(dir, "env.txt", core, sizeof core);
    check(strcmp(core, "Haswell\n") == 0, "the baseline runs the bench's OpenBLAS core");
    remove_venv(dir);
}

static void test_a_served_baseline(void)
{
    char dir[256];
    check(make_venv_script(dir, sizeof dir, served_script) == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_llama_cpp.py", &config, 2, NULL, &served) == 0, "the server is ready");
    check(served.skipped[0] == 0, "nothing skipped");
    check(strcmp(served.version, "llama.cpp fake 0.0") == 0, "its version is its first line");
    check(served.other_bytes == 5832704.0, "the bytes its step reads outside attention");
    check(served.request_seconds >= 0 && served.request_seconds < 1, "a ping's round trip");
    char args[1024];
    read_line(dir, "args.txt", args, sizeof args);
    check(strstr(args, "--head-dim 128 --rope-theta 500000 --threads 2 --serve") != NULL,
          "served: the config's shape, the threads, --serve");
    check(decode_baseline_prepare(&served, 4096, 16) == 0, "a cache of 16 x 4096 asked for and made");
    struct bench_request step = {.server = &served.server, .who = "fake llama.cpp"};
    snprintf(step.line, sizeof step.line, "step");
    check(bench_request_run(&step) == 0, "a step is a side's body that succeeds");
    snprintf(step.line, sizeof step.line, "fly");
    check(bench_request_run(&step) == 1, "a request answered with an error fails the body");
    check(decode_baseline_prepare(&served, 64, 3) == -1, "a cache the server could not make is refused");
    snprintf(step.line, sizeof step.line, "step");
    check(bench_request_run(&step) == 0, "and the server goes on");
    decode_baseline_stop(&served);
    check(served.server.pid == 0, "stopped");
    check(decode_baseline_prepare(&served, 512, 1) == -1, "a stopped server makes no cache");
    remove_venv(dir);
}

static void test_a_baseline_that_cannot_serve(void)
{
    char dir[256];
    check(make_venv(dir, sizeof dir, "unavailable No module named torch\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1, "no server");
    check(strcmp(served.skipped, "No module named torch") == 0, "the reason it gave");
    check(decode_baseline_prepare(&served, 512, 1) == -1, "and no cache");
    remove_venv(dir);
    check(make_venv(dir, sizeof dir, "torch 2.0\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1, "an exit before ready");
    check(strstr(served.skipped, "decode_torch.py exited with status 0 before it was ready") != NULL,
          "says so");
    remove_venv(dir);
    unsetenv("SNEPPX_BENCH_VENV");
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1 &&
              strstr(served.skipped, "no virtual environment") != NULL,
          "without a venv, skipped and why");
}

int main(void)
{
    test_a_served_baseline();
    test_a_baseline_that_cannot_serve();
    test_the_baseline_keeps_the_benchs_openblas_core();
    test_the_config_head_dim_is_the_baselines();
    test_results_and_bytes_outside_attention();
    test_no_bytes_said_prints_nothing();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("decode baselines: all checks passed\n");
    return 0;
}
