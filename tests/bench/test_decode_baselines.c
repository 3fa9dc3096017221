/* The decode baselines' servers (bench/decode_baselines.c) against a fake
 * virtual environment whose bin/python is a shell script: it records the
 * arguments and OPENBLAS_CORETYPE it was given, prints start-up lines as
 * decode_llama_cpp.py or decode_torch.py do, then answers requests as
 * bench/baselines/decode_serve.py does. Checks the start-up lines (the
 * version, the bytes llama.cpp's step reads outside attention, which the bench
 * says), the config's shape and the bench's OpenBLAS core reaching the
 * baseline, a cache asked for and answered, a step as a bench side's body, and
 * servers that are not there, exit, or answer an error. */
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
 * its OPENBLAS_CORETYPE to env.txt, and runs `body` (sh). */
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

/* A venv whose python prints `start` (printf's escapes), then serves decode_serve.py's
 * requests: a cache of 3 sequences of 64 tokens fails, any other is made. */
static int make_served_venv(char *dir, size_t size, const char *start)
{
    char body[2048];
    snprintf(body, sizeof body,
             "printf '%s'\n"
             "while read -r request rest; do\n"
             "  case \"$request\" in\n"
             "    ping) echo pong ;;\n"
             "    context) if [ \"$rest\" = '64 3' ]; then echo 'error RuntimeError: no room'; "
             "else echo \"ready $rest\"; fi ;;\n"
             "    step) echo 'done 0.001000' ;;\n"
             "    *) echo \"error unknown request $request\" ;;\n"
             "  esac\n"
             "done",
             start);
    return make_venv_script(dir, size, body);
}

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

static void test_a_served_baseline(void)
{
    char dir[256];
    check(make_served_venv(dir, sizeof dir, "llama.cpp fake 0.0\\nnonattention_bytes 5832704\\nready\\n") == 0,
          "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    const char *extra[] = {"--weight-type", "q8_0", NULL};
    check(decode_baseline_serve("decode_llama_cpp.py", &config, 2, extra, &served) == 0, "the server is ready");
    check(served.skipped[0] == 0, "nothing skipped");
    check(strcmp(served.version, "llama.cpp fake 0.0") == 0, "its version is its first line");
    check(served.other_bytes == 5832704.0, "the bytes its step reads outside attention");
    char text[96];
    decode_baseline_describe_other_bytes(served.other_bytes, text, sizeof text);
    check(strcmp(text, " (its step also reads 5.8 MB outside attention, not subtracted)") == 0,
          "the bench says them");
    check(served.request_seconds >= 0 && served.request_seconds < 1, "a ping's round trip");
    char args[1024];
    read_line(dir, "args.txt", args, sizeof args);
    check(strstr(args, "--head-dim 128 --rope-theta 500000 --threads 2 --weight-type q8_0") != NULL,
          "the config's shape, the threads, the caller's arguments");
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

static void test_no_bytes_said_prints_nothing(void)
{
    char dir[256];
    check(make_served_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\nready\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == 0, "the server is ready");
    check(strcmp(served.version, "torch 2.0 transformers 5.0") == 0, "its version");
    check(served.other_bytes == 0, "a baseline that says nothing reads nothing more");
    char text[96] = "stale";
    decode_baseline_describe_other_bytes(served.other_bytes, text, sizeof text);
    check(text[0] == 0, "and the bench says nothing");
    decode_baseline_stop(&served);
    remove_venv(dir);
}

static void test_the_config_head_dim_is_the_baselines(void)
{
    char dir[256];
    check(make_served_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\nready\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    sneppx_config config = llama3_shape();
    config.hidden_size = 2048; /* 64 per head by default, but the config says 128 (as Qwen3's do) */
    config.head_dim = 128;
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == 0, "the server is ready");
    decode_baseline_stop(&served);
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
    check(make_served_venv(dir, sizeof dir, "torch 2.0 transformers 5.0\\nready\\n") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == 0, "the server is ready");
    decode_baseline_stop(&served);
    unsetenv("OPENBLAS_CORETYPE");
    char core[64];
    read_line(dir, "env.txt", core, sizeof core);
    check(strcmp(core, "Haswell\n") == 0, "the baseline runs the bench's OpenBLAS core");
    remove_venv(dir);
}

static void test_a_baseline_that_cannot_serve(void)
{
    char dir[256];
    check(make_venv_script(dir, sizeof dir, "echo 'unavailable No module named torch'") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    const sneppx_config config = llama3_shape();
    struct decode_baseline_server served;
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1, "no server");
    check(strcmp(served.skipped, "No module named torch") == 0, "the reason it gave");
    check(decode_baseline_prepare(&served, 512, 1) == -1, "and no cache");
    remove_venv(dir);
    check(make_venv_script(dir, sizeof dir, "echo 'torch 2.0'") == 0, "fake venv made");
    setenv("SNEPPX_BENCH_VENV", dir, 1);
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1, "an exit before ready");
    check(strstr(served.skipped, "decode_torch.py exited with status 0 before it was ready") != NULL, "says so");
    remove_venv(dir);
    unsetenv("SNEPPX_BENCH_VENV");
    check(decode_baseline_serve("decode_torch.py", &config, 2, NULL, &served) == -1 &&
              strstr(served.skipped, "no virtual environment") != NULL,
          "without a venv, skipped and why");
}

int main(void)
{
    test_a_served_baseline();
    test_no_bytes_said_prints_nothing();
    test_the_config_head_dim_is_the_baselines();
    test_the_baseline_keeps_the_benchs_openblas_core();
    test_a_baseline_that_cannot_serve();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("decode baselines: all checks passed\n");
    return 0;
}
