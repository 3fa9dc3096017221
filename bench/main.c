/* sneppx-bench: every stage of the attention layer, side by side with its
 * baseline and the machine's measured limits, in one run.
 *
 *   sneppx-bench [--quick] [--stages LIST] [--csv FILE] [--plot FILE.png]
 *
 * bench/run.sh builds it and runs it in the right environment. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "bench.h"
#include "child.h"
#include "host.h"
#include "kernel_registry.h"
#include "kernels.h"
#include "report.h"
#include "sneppx/sneppx.h"
#include "tiles.h"

/* The baselines' instruction sets, read when their libraries load. This machine
 * sets the OpenBLAS pair to force AVX2 kernels (1.7-3.9x slower on 2 threads); a
 * fair baseline runs without them, unless sneppx itself runs a narrower target
 * than the host's (SNEPPX_TARGET=v8 on an AVX-512 host): then the baselines that can
 * be told run their AVX2 code too (OpenBLAS's Haswell kernels, PyTorch's and MKL's
 * AVX2). llama.cpp cannot: scripts/venv.sh builds it for the host (-march=native). */
static const struct {
    const char *name;
    const char *narrowed; /* its value when sneppx runs the narrower target; NULL: unset */
} blas_environment[] = {{"OPENBLAS_CORETYPE", "Haswell"},
                        {"OPENBLAS_L2_SIZE", NULL},
                        {"ATEN_CPU_CAPABILITY", "avx2"},
                        {"MKL_ENABLE_INSTRUCTIONS", "AVX2"}};
#define BLAS_ENVIRONMENT (sizeof blas_environment / sizeof *blas_environment)

static const struct {
    const char *name;
    int bit;
} stage_names[] = {
    {"peak", BENCH_STAGE_PEAK},     {"gemm", BENCH_STAGE_GEMM}, {"attention", BENCH_STAGE_ATTENTION},
    {"layer", BENCH_STAGE_LAYER},   {"jit", BENCH_STAGE_JIT},   {"memory", BENCH_STAGE_MEMORY},
    {"decode", BENCH_STAGE_DECODE}, {"generate", BENCH_STAGE_GENERATE}, {"precision", BENCH_STAGE_PRECISION},
};

static void usage(FILE *to)
{
    fprintf(to,
            "usage: sneppx-bench [--quick] [--stages LIST] [--csv FILE] [--plot FILE.png] [--gemm-tile RxC]\n"
            "  Measures the machine's FMA peak and read bandwidth, then sneppx's projections (vs OpenBLAS),\n"
            "  attention (flash vs SDPA), whole layers (vs PyTorch from $SNEPPX_BENCH_VENV, else from\n"
            "  /usr/bin/python3 when it has torch), JIT compile and cache times, the peak memory of a\n"
            "  long flash forward, decode attention over a paged K/V cache (vs the read bandwidth),\n"
            "  generation through the KV cache (decode vs llama.cpp and PyTorch from $SNEPPX_BENCH_VENV),\n"
            "  and the layer with bfloat16, float16 and int8 weights and caches against float32 (and\n"
            "  llama.cpp's f16/bf16/q8_0).\n"
            "  --quick        tiny sizes, one repeat: checks that the bench runs (no timing meaning)\n"
            "  --stages LIST  comma-separated subset of peak,gemm,attention,layer,jit,memory,decode,\n"
            "                 generate,precision\n"
            "                 (the peak stage always runs: every fraction of peak needs it)\n"
            "  --csv FILE     one row per measurement\n"
            "  --plot FILE    PNG chart of GFLOP/s against T per stage (bench/plot.py; writes FILE.csv\n"
            "                 too unless --csv is given)\n"
            "  --gemm-tile RxC  GEMM task of R rows x C columns instead of the runtime's (at most %dx%d,\n"
            "                 split evenly; C a multiple of %d), to measure another partition\n",
            SNEPPX_GEMM_MAX_TILE_ROWS, SNEPPX_GEMM_MAX_TILE_COLS, SNEPPX_GEMM_COL_ALIGN);
}

static int parse_stages(const char *list)
{
    int stages = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (size_t i = 0; i < sizeof stage_names / sizeof stage_names[0]; i++) {
            if (strcmp(name, stage_names[i].name) == 0) {
                stages |= stage_names[i].bit;
                found = 1;
            }
        }
        if (!found) {
            fprintf(stderr, "sneppx-bench: unknown stage '%s'\n", name);
            return -1;
        }
    }
    return stages | BENCH_STAGE_PEAK;
}

struct bench_plan bench_plan_for(const struct bench_context *ctx, int min_reps, int max_reps,
                                 double budget_seconds)
{
    if (ctx->quick)
        return (struct bench_plan){.warmup = 1, .min_reps = 1, .max_reps = 1, .budget_seconds = 0};
    return (struct bench_plan){.warmup = 1, .min_reps = min_reps, .max_reps = max_reps,
                               .budget_seconds = budget_seconds};
}

/* Re-executes the bench with the baselines' environment above: OpenBLAS reads it
 * when libopenblas loads, before main, so setting it here is too late. */
static void reexec_with_baseline_environment(char **argv)
{
    const int narrowed = read_probe_host_is_wide() && sneppx_host_target()->vector_width < 16;
    int differs = 0;
    for (size_t i = 0; i < BLAS_ENVIRONMENT; i++) {
        const char *want = narrowed ? blas_environment[i].narrowed : NULL, *have = getenv(blas_environment[i].name);
        differs |= want ? !have || strcmp(have, want) != 0 : have != NULL;
    }
    if (!differs)
        return;
    for (size_t i = 0; i < BLAS_ENVIRONMENT; i++) {
        const char *want = narrowed ? blas_environment[i].narrowed : NULL;
        if (want)
            setenv(blas_environment[i].name, want, 1);
        else
            unsetenv(blas_environment[i].name);
    }
    execv(BENCH_SELF_EXE, argv);
    perror("sneppx-bench: re-exec with the baselines' environment");
    fprintf(stderr, "sneppx-bench: the OpenBLAS baseline runs with this environment's overrides (unfair)\n");
}

static void print_cpu_model(void)
{
    FILE *cpuinfo = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (cpuinfo && fgets(line, sizeof line, cpuinfo)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *colon = strchr(line, ':');
            printf("cpu: %s", colon ? colon + 2 : line);
            break;
        }
    }
    if (cpuinfo)
        fclose(cpuinfo);
}

/* The host is shared: a load above idle makes every number here suspect, so say it. */
static void print_load(const char *when)
{
    double load = 0;
    FILE *loadavg = fopen("/proc/loadavg", "r");
    if (loadavg) {
        if (fscanf(loadavg, "%lf", &load) != 1)
            load = 0;
        fclose(loadavg);
    }
    printf("load average (1 min) %s: %.2f%s\n", when, load,
           load > 0.5 ? "  -- WARNING: other work is running; numbers are pessimistic" : "");
}

/* Seconds that some runnable task waited for a core since boot (Linux PSI,
 * /proc/pressure/cpu "some ... total=" in microseconds); -1 when unavailable. */
static double cpu_stalled_seconds(void)
{
    FILE *pressure = fopen("/proc/pressure/cpu", "r");
    if (!pressure)
        return -1;
    unsigned long long total = 0;
    const int found = fscanf(pressure, "some avg10=%*f avg60=%*f avg300=%*f total=%llu", &total) == 1;
    fclose(pressure);
    return found ? (double)total * 1e-6 : -1;
}

/* With the bench's threads at most one per core, a task waiting for a core
 * means other work shared the machine: say how much, per stage. */
static void print_contention(const char *stage, double seconds, double stalled)
{
    if (seconds <= 0 || stalled < 0)
        return;
    bench_record_value("contention", stage, "cpu-wait", 0, 0, 100 * stalled / seconds, "%");
    printf("   (CPU pressure during this stage: some task waited for a core %.0f%% of the time%s)\n",
           100 * stalled / seconds,
           stalled / seconds > 0.05 ? " -- other work was running; all-core rows are pessimistic" : "");
}

static int run_plot(const char *csv_path, const char *png_path)
{
    char *const argv[] = {(char *)SNEPPX_BENCH_PYTHON, (char *)SNEPPX_BENCH_SOURCE_DIR "/plot.py",
                          (char *)csv_path, (char *)png_path, NULL};
    struct bench_child child;
    if (bench_child_run(argv, NULL, NULL, &child) != 0) {
        fprintf(stderr, "sneppx-bench: cannot run %s\n", argv[1]);
        return 1;
    }
    fputs(child.output, stdout);
    free(child.output);
    return child.exit_code != 0;
}

int main(int argc, char **argv)
{
    reexec_with_baseline_environment(argv);
    if (argc >= 2 && strcmp(argv[1], "--child-start") == 0)
        return bench_child_start(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "--child-memory") == 0)
        return bench_child_memory(argc - 2, argv + 2);

    struct bench_context ctx = {.stages = BENCH_STAGE_ALL};
    const char *csv_path = NULL, *plot_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--quick") == 0) {
            ctx.quick = 1;
        } else if (strcmp(argv[i], "--stages") == 0 && value) {
            if ((ctx.stages = parse_stages(value)) < 0)
                return 2;
            i++;
        } else if (strcmp(argv[i], "--csv") == 0 && value) {
            csv_path = value;
            i++;
        } else if (strcmp(argv[i], "--plot") == 0 && value) {
            plot_path = value;
            i++;
        } else if (strcmp(argv[i], "--gemm-tile") == 0 && value) {
            long long rows = 0, cols = 0;
            if (sscanf(value, "%lldx%lld", &rows, &cols) != 2 || rows <= 0 || cols <= 0 ||
                cols % SNEPPX_GEMM_COL_ALIGN) {
                fprintf(stderr, "sneppx-bench: --gemm-tile wants ROWSxCOLS, COLS a multiple of %d\n",
                        SNEPPX_GEMM_COL_ALIGN);
                return 2;
            }
            bench_set_gemm_tile(rows, cols);
            i++;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "sneppx-bench: bad argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    char plot_csv[4096];
    if (plot_path && !csv_path) {
        snprintf(plot_csv, sizeof plot_csv, "%s.csv", plot_path);
        csv_path = plot_csv;
    }

    const int cores = omp_get_num_procs();
    ctx.thread_counts[ctx.thread_count_n++] = 1;
    if (cores > 1)
        ctx.thread_counts[ctx.thread_count_n++] = cores;
    ctx.target = sneppx_host_target();

    const double start = bench_now();
    printf("sneppx-bench%s: medians of repeated runs after a warm-up, [min-max]; GFLOP/s count only the "
           "arithmetic the mask keeps\n",
           ctx.quick ? " --quick (tiny sizes, one repeat: not a measurement)" : "");
    print_cpu_model();
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("cores: %d, sneppx target %s (vector width %d), OpenBLAS core %s (OPENBLAS_CORETYPE %s), kernel cache %s\n",
           cores, ctx.target->name, ctx.target->vector_width, openblas_get_corename(),
           coretype ? coretype : "unset", sneppx_cache_dir()[0] ? sneppx_cache_dir() : "(memory only)");
    if (coretype)
        printf("SNEPPX_TARGET runs a narrower target than this host's: the baselines run their AVX2 code too "
               "(OPENBLAS_CORETYPE=%s, ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS), but llama.cpp, built for "
               "this host by scripts/venv.sh, runs its widest\n", coretype);

    const struct sneppx_gemm_tiles tile = bench_gemm_tile(ctx.target, 2048, 6144, cores);
    printf("GEMM tasks %lldx%lld (rows x columns, qkv at T = 2048 on %d threads), attention tasks up to %d query rows x 1 K/V head, "
           "as templates/partition.h.j2\n",
           (long long)tile.rows, (long long)tile.cols, cores, SNEPPX_ATTN_TILE_ROWS);
    print_load("at start");

    static const struct {
        int bit;
        const char *name;
        void (*run)(struct bench_context *);
    } stages[] = {
        {BENCH_STAGE_PEAK, "peak", bench_stage_peak},
        {BENCH_STAGE_GEMM, "gemm", bench_stage_gemm},
        {BENCH_STAGE_ATTENTION, "attention", bench_stage_attention},
        {BENCH_STAGE_LAYER, "layer", bench_stage_layer},
        {BENCH_STAGE_JIT, "jit", bench_stage_jit},
        {BENCH_STAGE_MEMORY, "memory", bench_stage_memory},
        {BENCH_STAGE_DECODE, "decode", bench_stage_decode},
        {BENCH_STAGE_GENERATE, "generate", bench_stage_generate},
        {BENCH_STAGE_PRECISION, "precision", bench_stage_precision},
    };
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        if (!(ctx.stages & stages[i].bit))
            continue;
        const double stage_start = bench_now(), stalled_start = cpu_stalled_seconds();
        stages[i].run(&ctx);
        const double stalled_end = cpu_stalled_seconds();
        print_contention(stages[i].name, bench_now() - stage_start,
                         stalled_start < 0 || stalled_end < 0 ? -1 : stalled_end - stalled_start);
    }

    /* Phases of the cores that began after the peak stage's probe show here. */
    if (ctx.stages & ~BENCH_STAGE_PEAK) {
        bench_report_section("core speed at the end of the run", "as the peak stage's: every core at once");
        bench_report_core_speed(&ctx, "at end");
    }
    bench_report_targets(&ctx);
    read_probe_free(&ctx.beside);
    printf("\n");
    print_load("at end");
    if (csv_path) {
        if (bench_write_csv(csv_path) != 0) {
            perror(csv_path);
            ctx.failures++;
        } else {
            printf("\nrows written to %s\n", csv_path);
        }
    }
    if (plot_path && csv_path)
        ctx.failures += run_plot(csv_path, plot_path);
    printf("sneppx-bench: done in %.0f s%s\n", bench_now() - start,
           ctx.failures ? ", with failures (see above)" : "");
    return ctx.failures ? 1 : 0;
}
