/* ctest: two cores (a split compile runs a thread of its own) */
/* A compile whose code generation is split between two threads
 * (runtime/jit_codegen.c) emits the same functions as one that is not, in
 * an object bundle of two objects that links and runs as the whole one:
 *  - bundles: what sneppx_jit_compile_object hands the disk cache parses
 *    back; a truncated or lengthened bundle, or one whose count, sizes or
 *    magic are forged, is refused with an error naming the key, never read
 *    out of bounds;
 *  - per key (an int8 GEMM, flash, a bfloat16-cache decode): split in two
 *    objects that each hold at least a quarter of the code, every function
 *    the same size as in the whole object, both bundles link; a key of one function (SDPA) or little code (rmsnorm)
 *    stays whole;
 *  - unset SNEPPX_JIT_THREADS, a compile alone takes a second thread on two
 *    or more cores; a value other than 1 or 2 is refused with a warning;
 *  - end to end: a layer forward (float32 and int8 weights) compiled in a
 *    child process with SNEPPX_JIT_THREADS=1 and in one with 2, each with a
 *    cache directory of its own, gives the same output to the bit; the
 *    second child's cache holds divided kernels and its perf map names their
 *    split functions, the first's neither. */
#include "test_cache_common.h"

#include <llvm-c/Core.h>
#include <llvm-c/Object.h>

#include <sched.h>

#include "disk_cache.h"
#include "jit.h"
#include "object_bundle.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"

static test_tally tally;
#define CHECK(cond) TEST_CHECK(&tally, cond, "last error: %s", sneppx_last_error())

/* ---- bundles ---------------------------------------------------------------- */

static void check_bundles(void)
{
    char first[100], second[37];
    for (size_t i = 0; i < sizeof first; i++)
        first[i] = (char)i;
    memset(second, 7, sizeof second);
    const struct sneppx_object_span objects[] = {{first, sizeof first}, {second, sizeof second}};
    void *bundle = NULL;
    size_t size = 0;
    CHECK(sneppx_bundle_make(objects, 2, &bundle, &size) == SNEPPX_OK);
    struct sneppx_object_span back[SNEPPX_BUNDLE_MAX_OBJECTS];
    int count = 0;
    CHECK(sneppx_bundle_unpack(bundle, size, "k", back, &count) == SNEPPX_OK && count == 2);
    CHECK(count == 2 && back[0].size == sizeof first && memcmp(back[0].data, first, sizeof first) == 0 &&
          back[1].size == sizeof second && memcmp(back[1].data, second, sizeof second) == 0);
    CHECK((uintptr_t)back[1].data % 16 == (uintptr_t)bundle % 16);

    /* Every shorter prefix is refused (under ASan: without reading past it). */
    int refused = 0;
    for (size_t cut = 0; cut < size; cut++) {
        void *copy = malloc(cut ? cut : 1);
        memcpy(copy, bundle, cut);
        refused += sneppx_bundle_unpack(copy, cut, "cut-key", back, &count) == SNEPPX_ERR_JIT;
        free(copy);
    }
    CHECK(refused == (int)size);
    CHECK(strstr(sneppx_last_error(), "cut-key") != NULL);

    /* A byte more, a forged count or size, a bad magic: refused. */
    unsigned char *grown = calloc(1, size + 16);
    memcpy(grown, bundle, size);
    CHECK(sneppx_bundle_unpack(grown, size + 16, "k", back, &count) == SNEPPX_ERR_JIT);
    const size_t count_at = 8, first_size_at = 16;
    const uint32_t bad_counts[] = {0, 1, SNEPPX_BUNDLE_MAX_OBJECTS + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++) {
        memcpy(grown, bundle, size);
        memcpy(grown + count_at, &bad_counts[i], sizeof bad_counts[i]);
        CHECK(sneppx_bundle_unpack(grown, size, "k", back, &count) == SNEPPX_ERR_JIT);
    }
    const uint64_t bad_sizes[] = {0, sizeof first + 16, sizeof first - 16, SIZE_MAX, UINT64_MAX - 8};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        memcpy(grown, bundle, size);
        memcpy(grown + first_size_at, &bad_sizes[i], sizeof bad_sizes[i]);
        CHECK(sneppx_bundle_unpack(grown, size, "k", back, &count) == SNEPPX_ERR_JIT);
    }
    memcpy(grown, bundle, size);
    grown[0] ^= 1;
    CHECK(sneppx_bundle_unpack(grown, size, "k", back, &count) == SNEPPX_ERR_JIT);
    const size_t third_size_at = first_size_at + 2 * sizeof(uint64_t), padding_at = size - 1;
    memcpy(grown, bundle, size);
    grown[third_size_at] = 1; /* a size past the count */
    CHECK(sneppx_bundle_unpack(grown, size, "k", back, &count) == SNEPPX_ERR_JIT);
    memcpy(grown, bundle, size);
    grown[padding_at] = 1; /* the second object is 37 bytes: the bundle ends in padding */
    CHECK(sneppx_bundle_unpack(grown, size, "k", back, &count) == SNEPPX_ERR_JIT);
    void *refused_bundle = NULL;
    size_t refused_size = 0;
    const struct sneppx_object_span with_empty[] = {{first, sizeof first}, {second, 0}};
    CHECK(sneppx_bundle_make(objects, 0, &refused_bundle, &refused_size) == SNEPPX_ERR_JIT);
    CHECK(sneppx_bundle_make(with_empty, 2, &refused_bundle, &refused_size) == SNEPPX_ERR_JIT && !refused_bundle);
    free(grown);
    free(bundle);
}

/* ---- split keys --------------------------------------------------------------- */

#define MAX_FUNCTIONS 64

struct function_sizes {
    int count;
    char name[MAX_FUNCTIONS][SNEPPX_KEY_MAX + 64];
    uint64_t size[MAX_FUNCTIONS];
};

/* The sized symbols of one object, a split part's exported helpers under
 * their own names (the part after "__"). */
static void add_functions(const struct sneppx_object_span *object, struct function_sizes *out)
{
    LLVMMemoryBufferRef buffer = LLVMCreateMemoryBufferWithMemoryRange(object->data, object->size, "object", 0);
    char *message = NULL;
    LLVMBinaryRef binary = LLVMCreateBinary(buffer, NULL, &message);
    CHECK(binary != NULL);
    LLVMDisposeMessage(message);
    if (binary) {
        LLVMSymbolIteratorRef symbol = LLVMObjectFileCopySymbolIterator(binary);
        for (; !LLVMObjectFileIsSymbolIteratorAtEnd(binary, symbol); LLVMMoveToNextSymbol(symbol)) {
            const char *name = LLVMGetSymbolName(symbol), *split = strstr(name, "__");
            if (LLVMGetSymbolSize(symbol) == 0 || name[0] == '.' || out->count == MAX_FUNCTIONS)
                continue;
            snprintf(out->name[out->count], sizeof out->name[0], "%s", split ? split + 2 : name);
            out->size[out->count++] = LLVMGetSymbolSize(symbol);
        }
        LLVMDisposeSymbolIterator(symbol);
        LLVMDisposeBinary(binary);
    }
    LLVMDisposeMemoryBuffer(buffer);
}

static uint64_t size_of(const struct function_sizes *sizes, const char *name)
{
    for (int i = 0; i < sizes->count; i++)
        if (strcmp(sizes->name[i], name) == 0)
            return sizes->size[i];
    return 0;
}

static int64_t choice(const struct sneppx_kernel_family *family, const char *field, const char *name)
{
    for (int f = 0; f < family->field_count; f++)
        for (int c = 0; family->field_choices[f] && strcmp(family->field_names[f], field) == 0; c++)
            if (strcmp(family->field_choices[f][c], name) == 0)
                return c;
    return -1;
}

/* Compiles the key whole and split; expect_parts is what the split gives. */
static void check_key(const char *family_name, const int64_t *values, int expect_parts)
{
    const struct sneppx_kernel_family *family = sneppx_kernel_family_find(family_name);
    const struct sneppx_target *target = sneppx_host_target();
    char key[SNEPPX_KEY_MAX];
    CHECK(family && sneppx_kernel_key(family_name, values, target, key, sizeof key) == SNEPPX_OK);
    if (!family)
        return;
    struct function_sizes sizes[2] = {{0}, {0}};
    int parts[2] = {0, 0};
    uint64_t part_bytes[SNEPPX_BUNDLE_MAX_OBJECTS] = {0}; /* of the split compile's objects */
    for (int threads = 1; threads <= 2; threads++) {
        void *bundle = NULL;
        size_t size = 0;
        if (sneppx_jit_compile_object(family, values, target, threads, &bundle, &size) != SNEPPX_OK) {
            CHECK(!"compiles");
            fprintf(stderr, "  %s on %d threads: %s\n", key, threads, sneppx_last_error());
            continue;
        }
        struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
        CHECK(sneppx_bundle_unpack(bundle, size, key, objects, &parts[threads - 1]) == SNEPPX_OK);
        for (int i = 0; i < parts[threads - 1]; i++) {
            const int before = sizes[threads - 1].count;
            add_functions(&objects[i], &sizes[threads - 1]);
            for (int f = before; threads == 2 && f < sizes[1].count; f++)
                part_bytes[i] += sizes[1].size[f];
        }
        sneppx_kernel_fn entry[SNEPPX_ENTRY_COUNT];
        int object_at_fault = -1;
        CHECK(sneppx_jit_link_object(family, key, bundle, size, entry, &object_at_fault) == SNEPPX_OK &&
              object_at_fault == 0);
        for (int i = 0; i < family->entry_count; i++)
            CHECK(entry[i] != NULL);
        sneppx_jit_unlink_all_for_testing(); /* the other compile defines the same entries */
        free(bundle);
    }
    int same = sizes[0].count == sizes[1].count && sizes[0].count > 0;
    for (int i = 0; same && i < sizes[0].count; i++)
        same = size_of(&sizes[1], sizes[0].name[i]) == sizes[0].size[i];
    /* The parts share the work: neither holds less than a quarter of the code. */
    const uint64_t total = part_bytes[0] + part_bytes[1];
    const uint64_t smaller = part_bytes[0] < part_bytes[1] ? part_bytes[0] : part_bytes[1];
    CHECK(parts[0] == 1);
    CHECK(parts[1] == expect_parts);
    CHECK(same);
    CHECK(expect_parts == 1 || 4 * smaller >= total);
    printf("  %-50s whole 1 object, split %d (%llu + %llu code bytes); %d functions, %s sizes\n", key, parts[1],
           (unsigned long long)part_bytes[0], (unsigned long long)part_bytes[1], sizes[0].count,
           same ? "the same" : "DIFFERENT");
}

static void check_split_keys(void)
{
    const struct sneppx_kernel_family *gemm = sneppx_kernel_family_find("gemm");
    const struct sneppx_kernel_family *decode = sneppx_kernel_family_find("attn_decode");
    const struct sneppx_kernel_family *flash = sneppx_kernel_family_find("attn_flash");
    const struct sneppx_target *target = sneppx_host_target();
    const int64_t int8_gemm[] = {512, 768, 0, choice(gemm, "weight_type", "int8"), target->gemm_kc,
                                 target->gemm_int8_mc};
    const int64_t flash_causal[] = {128, 128, 4, 0, choice(flash, "mask_mode", "causal")};
    const int64_t decode_bf16[] = {128, 128, 4, 0, choice(decode, "mask_mode", "causal"),
                                   choice(decode, "kv_type", "bfloat16")};
    const int64_t sdpa_mask[] = {64, 64, 2, 0, choice(flash, "mask_mode", "mask")};
    const int64_t rmsnorm[] = {256};
    check_key("gemm", int8_gemm, 2);
    check_key("attn_flash", flash_causal, 2);
    check_key("attn_decode", decode_bf16, 2);
    check_key("attn_sdpa", sdpa_mask, 1); /* one function: nothing to divide */
    check_key("rmsnorm", rmsnorm, 1);
}

/* ---- end to end: the same output split or whole ----------------------------- */

enum { HIDDEN = 256, SEQ = 24 };

/* The kernels in this process's cache directory compiled in two objects. */
static int divided_entries(void)
{
    const char *dir = sneppx_disk_cache_path();
    DIR *stream = dir ? opendir(dir) : NULL;
    int divided = 0;
    for (struct dirent *entry; stream && (entry = readdir(stream));) {
        char key[SNEPPX_KEY_MAX];
        const size_t length = strlen(entry->d_name);
        if (length < 3 || length - 2 >= sizeof key || strcmp(entry->d_name + length - 2, ".o") != 0)
            continue;
        memcpy(key, entry->d_name, length - 2);
        key[length - 2] = '\0';
        uint8_t fingerprint[SNEPPX_SHA256_SIZE];
        void *payload = NULL;
        size_t size = 0;
        char reason[160];
        struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
        int count = 0;
        if (sneppx_kernel_fingerprint(key, fingerprint) == SNEPPX_OK &&
            sneppx_disk_cache_load(key, fingerprint, &payload, &size, reason, sizeof reason) == SNEPPX_DISK_HIT &&
            sneppx_bundle_unpack(payload, size, key, objects, &count) == SNEPPX_OK)
            divided += count > 1;
        free(payload);
    }
    if (stream)
        closedir(stream);
    return divided;
}

/* perf map lines of this process that name a function a split exported. */
static int mapped_split_functions(void)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
    FILE *map = fopen(path, "r");
    int found = 0;
    while (map && fgets(line, sizeof line, map))
        found += strstr(line, "__sneppx_") != NULL;
    if (map)
        fclose(map);
    unlink(path);
    return found;
}

/* Child: a forward of a small GQA layer (head_dim 128, so flash's tiles are
 * the presets') with weight_dtype, written to $SPLIT_TEST_OUT; prints how
 * many of its kernels were divided and how many split functions the perf
 * map names. */
static int child_forward(sneppx_dtype weight_dtype)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN, config.num_attention_heads = 2, config.num_key_value_heads = 1;
    config.head_dim = 128, config.weight_dtype = weight_dtype, config.num_threads = 1;
    static float hidden[SEQ * HIDDEN], out[SEQ * HIDDEN];
    test_rng rng = test_rng_seeded(20261204);
    test_fill_uniform(&rng, hidden, SEQ * HIDDEN, 1.0f);
    sneppx_layer *layer = NULL;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK ||
        sneppx_layer_forward(layer, 1, SEQ, hidden, NULL, NULL, NULL, out) != SNEPPX_OK) {
        fprintf(stderr, "forward: %s\n", sneppx_last_error());
        return 1;
    }
    sneppx_layer_destroy(layer);
    FILE *file = fopen(getenv("SPLIT_TEST_OUT"), "wb");
    int written = file && fwrite(out, sizeof out, 1, file) == 1;
    if (file)
        fclose(file);
    printf("divided kernels: %d, split functions in the perf map: %d\n", divided_entries(),
           mapped_split_functions());
    return written ? 0 : 1;
}

static int read_output(const char *path, float *out, size_t count)
{
    FILE *file = fopen(path, "rb");
    int read = file && fread(out, sizeof *out, count, file) == count;
    if (file)
        fclose(file);
    return read;
}

/* Runs scenario in a child with its own cache directory and
 * SNEPPX_JIT_THREADS=threads_value; its output into out, its log returned
 * (malloc'd, or NULL). */
static char *run_forward_child(const char *scenario, const char *threads_value, float *out)
{
    char dir[CACHE_TEST_DIR_MAX], out_path[CACHE_TEST_PATH_MAX];
    char cache_env[CACHE_TEST_ENV_MAX], out_env[CACHE_TEST_ENV_MAX], threads_env[64];
    CHECK(cache_test_make_dir(dir, sizeof dir, "split") == 0);
    snprintf(out_path, sizeof out_path, "%s/out.bin", dir);
    snprintf(cache_env, sizeof cache_env, "SNEPPX_CACHE_DIR=%s", dir);
    snprintf(out_env, sizeof out_env, "SPLIT_TEST_OUT=%s", out_path);
    snprintf(threads_env, sizeof threads_env, "SNEPPX_JIT_THREADS=%s", threads_value);
    const char *changes[] = {cache_env, out_env, threads_env, "SNEPPX_PERF_MAP=1", NULL};
    char *log = NULL;
    const int code = cache_test_run_child(scenario, changes, &log);
    CHECK(code == 0);
    if (code != 0)
        fprintf(stderr, "  child %s, SNEPPX_JIT_THREADS=%s: %s\n", scenario, threads_value, log ? log : "");
    CHECK(read_output(out_path, out, SEQ * HIDDEN));
    cache_test_remove_tree(dir);
    return log;
}

static void check_forward(const char *scenario)
{
    static float outputs[2][SEQ * HIDDEN];
    int divided[2] = {-1, -1}, mapped[2] = {-1, -1};
    for (int threads = 1; threads <= 2; threads++) {
        char *log = run_forward_child(scenario, threads == 1 ? "1" : "2", outputs[threads - 1]);
        const char *counts = log ? strstr(log, "divided kernels:") : NULL;
        CHECK(counts && sscanf(counts, "divided kernels: %d, split functions in the perf map: %d",
                               &divided[threads - 1], &mapped[threads - 1]) == 2);
        free(log);
    }
    int finite = 1;
    double magnitude = 0;
    for (int i = 0; i < SEQ * HIDDEN; i++) {
        finite &= isfinite(outputs[0][i]);
        magnitude += fabs(outputs[0][i]);
    }
    const int same = memcmp(outputs[0], outputs[1], sizeof outputs[0]) == 0;
    CHECK(finite && magnitude > 0);
    CHECK(divided[0] == 0 && mapped[0] == 0);
    CHECK(divided[1] >= 2 && mapped[1] > 0); /* at least the two GEMM keys and flash's */
    CHECK(same);
    printf("  forward (%s): %d kernels divided (%d split functions in the perf map), the output %s as "
           "undivided\n", scenario, divided[1], mapped[1], same ? "the same" : "DIFFERENT");
}

/* A value other than 1 or 2 is refused with a warning that names the variable. */
static void check_bad_threads_value(void)
{
    static float output[SEQ * HIDDEN];
    char *log = run_forward_child("forward-float32", "3", output);
    CHECK(log && strstr(log, "SNEPPX_JIT_THREADS='3'") != NULL);
    printf("  SNEPPX_JIT_THREADS=3: %s\n", log && strstr(log, "SNEPPX_JIT_THREADS='3'") ? "warned" : "NOT WARNED");
    free(log);
}

/* Without SNEPPX_JIT_THREADS, a compile alone in a process on two or more
 * cores takes the second thread; on one core it does not. */
static void check_automatic_choice(void)
{
    const char *forced = getenv("SNEPPX_JIT_THREADS");
    if (forced && forced[0]) {
        printf("  automatic choice: not checked, SNEPPX_JIT_THREADS=%s\n", forced);
        return;
    }
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const struct sneppx_kernel_family *gemm = sneppx_kernel_family_find("gemm");
    const struct sneppx_target *target = sneppx_host_target();
    const int64_t int8_gemm[] = {512, 768, 0, choice(gemm, "weight_type", "int8"), target->gemm_kc,
                                 target->gemm_int8_mc};
    void *bundle = NULL;
    size_t size = 0;
    struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
    int count = 0;
    CHECK(sneppx_jit_compile_object(gemm, int8_gemm, target, 0, &bundle, &size) == SNEPPX_OK &&
          sneppx_bundle_unpack(bundle, size, "gemm", objects, &count) == SNEPPX_OK);
    CHECK(count == (cpus >= 2 ? 2 : 1));
    printf("  automatic choice on %d cores: %d object%s\n", cpus, count, count == 1 ? "" : "s");
    free(bundle);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "forward-float32") == 0)
        return child_forward(SNEPPX_DTYPE_FLOAT32);
    if (argc == 2 && strcmp(argv[1], "forward-int8") == 0)
        return child_forward(SNEPPX_DTYPE_INT8);
    check_bundles();
    check_split_keys();
    check_automatic_choice();
    check_forward("forward-float32");
    check_forward("forward-int8");
    check_bad_threads_value();
    return test_finish(&tally);
}
