/* ctest: two cores (threads or processes of its own; ctest -j2 runs it alone) */
/* The vendored layer and the runtime run one pipeline. For every preset:
 *   keys       sneppx-gen's manifest lists exactly the kernels a layer of the
 *              preset resolves (sneppx_layer_keys, flash with and without a mask);
 *   tasks      both forwards make the same kernel calls: the same stages in the
 *              same order, each over the same tasks (rows, columns, heads,
 *              strides, lengths, scale, mask or not), for several sizes, 1 and 2
 *              threads, no mask, a mask per sequence, one mask for all, given
 *              positions (templates/partition.h.j2 and the stage runners of
 *              runtime/forward.c and templates/layer*.c.j2);
 *   arguments  both accept and refuse the same batch / seq_len (up to and past
 *              2^24, 2^26 tokens and the 2^40-float activation bound), mask
 *              shapes and positions, refusing in the same words;
 *   cached     sneppx_layer_forward_cached over a paged cache and the vendored
 *              _forward_cached over caller-owned caches make the same calls
 *              (ragged prefill and chunk steps of 3 sequences, 1 and 2
 *              threads) but for the attention's K/V strides (the runtime
 *              gathers a tile's keys from its pages, the vendored layer reads
 *              the caches in place), and refuse n_seqs, q_lens and positions
 *              in the same words. Every step gives each sequence more than
 *              SNEPPX_DECODE_MAX_QUERIES tokens: shorter runs take attn_decode
 *              over the pages in the runtime and flash over the contiguous
 *              caches in the vendored layer, by design not call for call;
 *              tests/python/test_aot_cached.py compares their numbers.
 *
 * Each preset's vendored file is generated here (gen/sneppx-gen under
 * $SNEPPX_PYTHON) and built with cc into a shared library whose kernel calls
 * come to this test (SNEPPX_AOT_KERNEL_CALL) instead of running; the runtime's
 * layer is created without weights (sneppx_layer_create_unpacked) and its
 * kernels are replaced by recorders. So no side packs a preset's weights
 * (405B's would take 4.6 GB) and the vendored packed buffer is never touched
 * (it is mapped PROT_NONE). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "layer_internal.h"
#include "sneppx/sneppx.h"
#include "test_util.h"

static test_tally tally;

/* ---- one kernel call, as both sides record it ----------------------------------- */

struct call {
    char key[SNEPPX_KEY_MAX];
    int64_t row_begin, row_end, col_begin, col_end;
    int64_t src_stride, dst_stride, rope_heads, rope_head_stride;
    int64_t q_stride, k_stride, v_stride, o_stride, mask_stride, q_len, kv_len;
    int64_t mask_offset; /* floats from the caller's mask, -1 without (a bias is the key's: bias0 / bias1) */
    float softmax_scale, eps;
};

struct trace {
    struct call *calls;
    int64_t count, capacity;
};

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static struct trace *recording;
static const float *mask_base; /* the mask both sides were given */

static void record(const char *key, const struct sneppx_args *args)
{
    struct call c;
    memset(&c, 0, sizeof c);
    snprintf(c.key, sizeof c.key, "%s", key);
    c.row_begin = args->row_begin;
    c.row_end = args->row_end;
    c.col_begin = args->col_begin;
    c.col_end = args->col_end;
    c.src_stride = args->src_stride;
    c.dst_stride = args->dst_stride;
    c.rope_heads = args->rope_heads;
    c.rope_head_stride = args->rope_head_stride;
    c.q_stride = args->q_stride;
    c.k_stride = args->k_stride;
    c.v_stride = args->v_stride;
    c.o_stride = args->o_stride;
    c.mask_stride = args->mask_stride;
    c.q_len = args->q_len;
    c.kv_len = args->kv_len;
    c.mask_offset = args->mask ? args->mask - mask_base : -1;
    c.softmax_scale = args->softmax_scale;
    c.eps = args->eps;
    pthread_mutex_lock(&trace_lock);
    struct trace *t = recording;
    if (t->count == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 256;
        t->calls = realloc(t->calls, (size_t)t->capacity * sizeof *t->calls);
        if (!t->calls)
            abort();
    }
    t->calls[t->count++] = c;
    pthread_mutex_unlock(&trace_lock);
}

static int compare_calls(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct call));
}

/* Calls of one stage run on several threads in any order; a stage is a run of
 * calls of one key (two stages of one key in a row merge, on both sides alike). */
static void sort_stages(struct trace *t)
{
    for (int64_t first = 0; first < t->count;) {
        int64_t end = first + 1;
        while (end < t->count && strcmp(t->calls[end].key, t->calls[first].key) == 0)
            end++;
        qsort(t->calls + first, (size_t)(end - first), sizeof *t->calls, compare_calls);
        first = end;
    }
}

static void describe(const struct call *c, char *text, size_t size)
{
    if (!c) {
        snprintf(text, size, "(no call)");
        return;
    }
    snprintf(text, size,
             "%s rows [%lld, %lld) cols [%lld, %lld) src/dst stride %lld/%lld rope heads %lld x %lld "
             "q/k/v/o stride %lld/%lld/%lld/%lld mask at %lld stride %lld len %lld/%lld scale %.9g eps %g",
             c->key, (long long)c->row_begin, (long long)c->row_end, (long long)c->col_begin, (long long)c->col_end,
             (long long)c->src_stride, (long long)c->dst_stride, (long long)c->rope_heads,
             (long long)c->rope_head_stride, (long long)c->q_stride, (long long)c->k_stride, (long long)c->v_stride,
             (long long)c->o_stride, (long long)c->mask_offset, (long long)c->mask_stride, (long long)c->q_len,
             (long long)c->kv_len, c->softmax_scale, c->eps);
}

static void check_same_calls(struct trace *runtime, struct trace *vendored, const char *what)
{
    sort_stages(runtime);
    sort_stages(vendored);
    int64_t i = 0;
    while (i < runtime->count && i < vendored->count &&
           compare_calls(&runtime->calls[i], &vendored->calls[i]) == 0)
        i++;
    if (i == runtime->count && i == vendored->count && i > 0) {
        tally.passed++;
        return;
    }
    char a[512], b[512];
    describe(i < runtime->count ? &runtime->calls[i] : NULL, a, sizeof a);
    describe(i < vendored->count ? &vendored->calls[i] : NULL, b, sizeof b);
    TEST_CHECK(&tally, 0, "%s: %lld runtime calls, %lld vendored; first difference at call %lld:\n  runtime:  %s\n  vendored: %s",
               what, (long long)runtime->count, (long long)vendored->count, (long long)i, a, b);
}

/* ---- the runtime side: recorders in place of the layer's kernels ---------------- */

#define SLOTS 16
static sneppx_kernel recorders[SLOTS];

#define RECORDER(i) \
    static void recorder##i(const struct sneppx_args *args) { record(recorders[i].key, args); }
RECORDER(0) RECORDER(1) RECORDER(2) RECORDER(3) RECORDER(4) RECORDER(5) RECORDER(6) RECORDER(7)
RECORDER(8) RECORDER(9) RECORDER(10) RECORDER(11) RECORDER(12) RECORDER(13) RECORDER(14) RECORDER(15)
static const sneppx_kernel_fn recorder_fns[SLOTS] = {
    recorder0, recorder1, recorder2,  recorder3,  recorder4,  recorder5,  recorder6,  recorder7,
    recorder8, recorder9, recorder10, recorder11, recorder12, recorder13, recorder14, recorder15};

/* Every kernel slot of the layer, with flash's explicit-mask kernel resolved
 * first (a layer resolves it at its first masked forward). */
static int replace_kernels(sneppx_layer *layer)
{
    const sneppx_kernel *masked;
    if (!TEST_CHECK(&tally, sneppx_layer_attention_kernel(layer, 1, 1, &masked) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        return 0;
    const sneppx_kernel **slots[] = {&layer->qkv_proj.kernel, &layer->o_proj.kernel, &layer->q_a_proj.kernel,
                                     &layer->kv_a_proj.kernel, &layer->kv_b_proj.kernel, &layer->absorb_uk.kernel,
                                     &layer->absorb_uv.kernel, &layer->q_a_norm, &layer->kv_a_norm, &layer->rope};
    int used = 0;
    for (size_t s = 0; s < sizeof slots / sizeof slots[0]; s++) {
        if (!*slots[s])
            continue;
        recorders[used] = **slots[s];
        recorders[used].entry[0] = recorder_fns[used];
        *slots[s] = &recorders[used++];
    }
    for (int explicit_mask = 0; explicit_mask < 2; explicit_mask++) {
        const sneppx_kernel *attention = atomic_load(&layer->attention[1][explicit_mask]);
        recorders[used] = *attention;
        recorders[used].entry[0] = recorder_fns[used];
        atomic_store(&layer->attention[1][explicit_mask], &recorders[used++]);
    }
    return 1;
}

/* ---- the vendored side: a generated file built with a tracing hook -------------- */

struct vendored {
    void *library;
    int64_t (*packed_floats)(void);
    int64_t (*scratch_floats)(int64_t, int64_t, int);
    int (*forward)(const float *, int64_t, int64_t, const float *, const float *, const int64_t *, const int64_t *,
                   float *, float *, int);
    int64_t (*cached_scratch_floats)(int64_t, int64_t, int);
    int (*forward_cached)(const float *, int64_t, const int64_t *, const int64_t *, float *const *, float *const *,
                          int64_t, const float *, const int64_t *, float *, float *, int);
    const char *(*last_error)(void);
    char keys[SLOTS][SNEPPX_KEY_MAX];
    void (*symbols[SLOTS])(void); /* the entry point of keys[i] */
    int key_count;
    float *packed; /* PROT_NONE: the traced forward must never read it */
    size_t packed_bytes;
};

#define VENDORED_OK 0 /* SNEPPX_AOT_OK of the generated header */

static struct vendored *current;

static void vendored_hook(void (*kernel)(void), const void *args)
{
    for (int i = 0; i < current->key_count; i++)
        if (current->symbols[i] == kernel) {
            record(current->keys[i], args);
            return;
        }
    record("(a kernel not in the manifest)", args);
}

static int run_command(const char *command)
{
    const int status = system(command);
    return TEST_CHECK(&tally, status == 0, "`%s` exited with %d", command, status);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = calloc(1, 1 << 20);
    if (text)
        text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
    fclose(f);
    return text;
}

/* sneppx-gen --arch name, built into DIR/libtrace.so with SNEPPX_AOT_KERNEL_CALL hooked. */
static int vendored_open(const char *name, const char *target, struct vendored *v)
{
    memset(v, 0, sizeof *v);
    const char *source = getenv("SNEPPX_SOURCE_DIR"), *binary = getenv("SNEPPX_BINARY_DIR");
    const char *python = getenv("SNEPPX_PYTHON");
    if (!TEST_CHECK(&tally, source && binary, "SNEPPX_SOURCE_DIR and SNEPPX_BINARY_DIR must be set (ctest sets them)"))
        return 0;
    char dir[1024], command[4096], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/vendored-agreement", binary);
    mkdir(dir, 0700);
    snprintf(dir, sizeof dir, "%s/tests/vendored-agreement/%s", binary, name);
    snprintf(command, sizeof command, "'%s' '%s/gen/sneppx-gen' --arch '%s' --target '%s' --flash -o '%s' > /dev/null",
             python ? python : "/usr/bin/python3", source, name, target, dir);
    if (!run_command(command))
        return 0;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *manifest = read_text(path);
    const char *at = manifest ? strstr(manifest, "\"prefix\": \"") : NULL;
    char prefix[256] = "";
    if (at)
        sscanf(at + strlen("\"prefix\": \""), "%255[^\"]", prefix);
    free(manifest);
    if (!TEST_CHECK(&tally, prefix[0], "%s: no prefix in the manifest", path))
        return 0;
    /* The kernels' keys; their entry points are the layer file's own (static),
     * so the wrapper, in the same translation unit, lists them in key order. */
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    char *keys = read_text(path);
    if (!TEST_CHECK(&tally, keys != NULL, "cannot read %s", path))
        return 0;
    char entry_list[SLOTS * (SNEPPX_KEY_MAX + 48)] = "";
    for (char *line = strtok(keys, "\n"); line && v->key_count < SLOTS; line = strtok(NULL, "\n")) {
        snprintf(v->keys[v->key_count], SNEPPX_KEY_MAX, "%s", line);
        /* The entry point of a key: sneppx_ + the key with '-' and '.' as '_' (kernels.symbol_of_key). */
        char symbol[SNEPPX_KEY_MAX + 16];
        snprintf(symbol, sizeof symbol, "sneppx_%s", line);
        for (char *c = symbol; *c; c++)
            *c = *c == '-' || *c == '.' ? '_' : *c;
        const size_t used = strlen(entry_list);
        snprintf(entry_list + used, sizeof entry_list - used, "    (void (*)(void))%s,\n", symbol);
        v->key_count++;
    }
    free(keys);
    snprintf(path, sizeof path, "%s/trace.c", dir);
    FILE *wrapper = fopen(path, "w");
    if (!TEST_CHECK(&tally, wrapper != NULL, "cannot write %s", path))
        return 0;
    fprintf(wrapper,
            "/* The vendored layer with every kernel call sent to a hook (tests/test_vendored_agreement.c). */\n"
            "void (*sneppx_trace_hook)(void (*)(void), const void *);\n"
            "#define SNEPPX_AOT_KERNEL_CALL(kernel, args) sneppx_trace_hook((void (*)(void))(kernel), (args))\n"
            "#include \"%s.c\"\n"
            "void (*const sneppx_trace_entries[])(void) = {\n%s};\n",
            prefix, entry_list);
    fclose(wrapper);
    snprintf(command, sizeof command,
             "cc -std=c11 -O0 -fPIC -shared -fopenmp -Wall -Wextra -Werror -I '%s' '%s/trace.c' -o '%s/libtrace.so' -lm",
             dir, dir, dir);
    if (!run_command(command))
        return 0;
    snprintf(path, sizeof path, "%s/libtrace.so", dir);
    v->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!TEST_CHECK(&tally, v->library != NULL, "dlopen %s: %s", path, dlerror()))
        return 0;
    char symbol[512];
#define FIND(field, suffix)                                                   \
    snprintf(symbol, sizeof symbol, "%s%s", prefix, suffix);                   \
    *(void **)&v->field = dlsym(v->library, symbol);                           \
    if (!TEST_CHECK(&tally, v->field != NULL, "%s: no symbol %s", path, symbol)) \
        return 0;
    FIND(packed_floats, "_packed_floats")
    FIND(scratch_floats, "_scratch_floats")
    FIND(forward, "_forward")
    FIND(last_error, "_last_error")
    FIND(cached_scratch_floats, "_cached_scratch_floats")
    FIND(forward_cached, "_forward_cached")
#undef FIND
    void (**hook)(void (*)(void), const void *) = dlsym(v->library, "sneppx_trace_hook");
    if (!TEST_CHECK(&tally, hook != NULL, "%s: no sneppx_trace_hook", path))
        return 0;
    *hook = vendored_hook;

    void (*const *entries)(void) = dlsym(v->library, "sneppx_trace_entries");
    if (!TEST_CHECK(&tally, entries != NULL, "%s: no sneppx_trace_entries", path))
        return 0;
    for (int i = 0; i < v->key_count; i++)
        v->symbols[i] = entries[i];
    v->packed_bytes = (size_t)v->packed_floats() * sizeof(float);
    v->packed = mmap(NULL, v->packed_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return TEST_CHECK(&tally, v->packed != MAP_FAILED, "mmap of %zu bytes failed", v->packed_bytes);
}

static void vendored_close(struct vendored *v)
{
    if (v->packed && v->packed != MAP_FAILED)
        munmap(v->packed, v->packed_bytes);
    if (v->library)
        dlclose(v->library);
}

/* ---- the checks ------------------------------------------------------------------ */

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_keys(const sneppx_layer *layer, const struct vendored *v, const char *name)
{
    char *copy = strdup(sneppx_layer_keys(layer));
    const char *runtime[SLOTS], *vendored[SLOTS];
    int count = 0;
    for (char *line = strtok(copy, "\n"); line && count < SLOTS; line = strtok(NULL, "\n"))
        runtime[count++] = line;
    for (int i = 0; i < v->key_count; i++)
        vendored[i] = v->keys[i];
    qsort(runtime, (size_t)count, sizeof *runtime, compare_strings);
    qsort(vendored, (size_t)v->key_count, sizeof *vendored, compare_strings);
    int same = count == v->key_count;
    for (int i = 0; same && i < count; i++)
        same = strcmp(runtime[i], vendored[i]) == 0;
    TEST_CHECK(&tally, same, "%s: the manifest's keys are not the layer's:\nlayer:\n%smanifest: %d keys, first %s", name,
               sneppx_layer_keys(layer), v->key_count, v->key_count ? v->keys[0] : "-");
    free(copy);
}

/* Whether one side accepted a call, and its message. */
struct verdict {
    int accepted;
    char message[256];
};

static void runtime_verdict(struct verdict *runtime, sneppx_status status)
{
    runtime->accepted = status == SNEPPX_OK;
    snprintf(runtime->message, sizeof runtime->message, "%s", status == SNEPPX_OK ? "" : sneppx_last_error());
}

static void vendored_verdict(struct verdict *vendored, const struct vendored *v, int code)
{
    vendored->accepted = code == VENDORED_OK;
    snprintf(vendored->message, sizeof vendored->message, "%s", code == VENDORED_OK ? "" : v->last_error());
}

/* The vendored forward's scratch, 64-byte aligned; NULL when it needs none (the call is then refused). */
static float *vendored_scratch(int64_t floats)
{
    return floats > 0 ? aligned_alloc(64, ((size_t)floats * sizeof(float) + 63) / 64 * 64) : NULL;
}

/* One forward on both sides; returns whether each accepted it, and the messages. */
static void run_both(sneppx_layer *layer, struct vendored *v, int64_t batch, int64_t seq_len, const float *mask,
                     const int64_t *shape, const int64_t *positions, int threads, struct trace *rt,
                     struct trace *vt, struct verdict *runtime, struct verdict *vendored)
{
    const int64_t hidden = layer->config.hidden_size;
    float *x = calloc((size_t)(batch * seq_len * hidden), sizeof(float));
    float *out = calloc((size_t)(batch * seq_len * hidden), sizeof(float));
    layer->config.num_threads = threads;
    mask_base = mask;
    recording = rt;
    sneppx_status status = sneppx_layer_forward(layer, batch, seq_len, x, mask, shape, positions, out);
    runtime_verdict(runtime, status);

    const int64_t floats = v->scratch_floats(batch, seq_len, threads);
    float *scratch = vendored_scratch(floats);
    recording = vt;
    current = v;
    const int code = scratch ? v->forward(v->packed, batch, seq_len, x, mask, shape, positions, out, scratch, threads)
                             : -1;
    vendored_verdict(vendored, v, code);
    free(scratch);
    free(x);
    free(out);
}

/* Where the runtime's hint past max_position_embeddings begins (its config can be
 * changed; a vendored layer's is fixed), after `lead`: " (" or "; ". NULL: none. */
static char *runtime_hint(char *message, const char *lead)
{
    static const char *const hints[] = {"HF runs on past it", "this RoPE's frequencies depend"};
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++) {
        char start[64];
        snprintf(start, sizeof start, "%s%s", lead, hints[i]);
        char *at = strstr(message, start);
        if (at)
            return at;
    }
    return NULL;
}

/* The runtime's words, less the hint only it has. */
static void drop_runtime_hint(struct verdict *runtime)
{
    char *at = runtime_hint(runtime->message, " (");
    if (at)
        *at = '\0';
}

static void check_verdicts(struct verdict *runtime, const struct verdict *vendored, const char *what)
{
    drop_runtime_hint(runtime);
    TEST_CHECK(&tally, runtime->accepted == vendored->accepted && strcmp(runtime->message, vendored->message) == 0,
               "%s: runtime %s '%s', vendored %s '%s'", what, runtime->accepted ? "accepts" : "refuses",
               runtime->message, vendored->accepted ? "accepts" : "refuses", vendored->message);
}

/* Stages and tasks of accepted forwards: sizes x threads x masks x positions. */
static void check_tasks(sneppx_layer *layer, struct vendored *v, const char *name)
{
    static const int64_t sizes[][2] = {{1, 1}, {1, 5}, {2, 37}, {3, 130}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t batch = sizes[s][0], seq_len = sizes[s][1];
        float *mask = calloc((size_t)(batch * seq_len * seq_len), sizeof(float));
        int64_t *positions = malloc((size_t)(batch * seq_len) * sizeof *positions);
        for (int64_t i = 0; i < batch * seq_len; i++)
            positions[i] = 3 * (i % seq_len) + (i % seq_len) % 2;
        const int64_t own[4] = {batch, 1, seq_len, seq_len}, shared[4] = {1, 1, seq_len, seq_len};
        for (int threads = 1; threads <= 2; threads++)
            for (int m = 0; m < 3; m++) {
                struct trace rt = {0}, vt = {0};
                struct verdict a, b;
                run_both(layer, v, batch, seq_len, m ? mask : NULL, m == 1 ? own : m == 2 ? shared : NULL,
                         m ? positions : NULL, threads, &rt, &vt, &a, &b);
                char what[200];
                snprintf(what, sizeof what, "%s batch %lld seq %lld threads %d %s", name, (long long)batch,
                         (long long)seq_len, threads, m == 0 ? "causal" : m == 1 ? "mask per sequence" : "one mask");
                check_verdicts(&a, &b, what);
                if (a.accepted && b.accepted)
                    check_same_calls(&rt, &vt, what);
                free(rt.calls);
                free(vt.calls);
            }
        free(mask);
        free(positions);
    }
}

/* Sizes: the runtime checks them before hidden_states, so a NULL one tells
 * whether the sizes passed; the vendored layer's _scratch_floats checks only them. */
static void check_sizes(sneppx_layer *layer, struct vendored *v, const char *name)
{
    const int64_t per_token = layer->qkv_dim + layer->attn_dim + layer->config.hidden_size;
    const int64_t by_floats = ((int64_t)1 << 40) / per_token; /* the activation bound in tokens */
    const int64_t big = (int64_t)1 << 24;
    const int64_t sizes[][2] = {{0, 1}, {1, 0}, {-3, 2}, {2, -1}, {1, big}, {1, big + 1}, {big + 1, 1}, {big, 4},
                                {4, big}, {5, big}, {big, 5}, {INT64_MAX, 2}, {by_floats / 1024, 1024},
                                {by_floats / 1024 + 1, 1024}, {1024, by_floats / 1024 + 1}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t batch = sizes[s][0], seq_len = sizes[s][1];
        float dummy;
        sneppx_status status = sneppx_layer_forward(layer, batch, seq_len, NULL, NULL, NULL, NULL, &dummy);
        struct verdict runtime = {0}, vendored = {0};
        runtime.accepted = strncmp(sneppx_last_error(), "hidden_states:", 14) == 0;
        snprintf(runtime.message, sizeof runtime.message, "%s", runtime.accepted ? "" : sneppx_last_error());
        (void)status;
        vendored.accepted = v->scratch_floats(batch, seq_len, 1) >= 0;
        snprintf(vendored.message, sizeof vendored.message, "%s", vendored.accepted ? "" : v->last_error());
        char what[160];
        snprintf(what, sizeof what, "%s batch %lld seq_len %lld", name, (long long)batch, (long long)seq_len);
        check_verdicts(&runtime, &vendored, what);
    }
}

/* Mask shapes and positions, each alone wrong (or right). */
static void check_masks_and_positions(sneppx_layer *layer, struct vendored *v, const char *name)
{
    static const int64_t shapes[][4] = {{2, 1, 5, 5}, {1, 1, 5, 5}, {3, 1, 5, 5}, {0, 1, 5, 5}, {2, 2, 5, 5},
                                        {2, 1, 4, 5}, {2, 1, 5, 6}, {1, 1, 5, 4}};
    float mask[2 * 5 * 5] = {0};
    for (size_t s = 0; s <= sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t *shape = s < sizeof shapes / sizeof shapes[0] ? shapes[s] : NULL; /* last: no shape */
        for (int64_t batch = 1; batch <= 2; batch++) {
            struct trace rt = {0}, vt = {0};
            struct verdict a, b;
            run_both(layer, v, batch, 5, mask, shape, NULL, 1, &rt, &vt, &a, &b);
            char what[160];
            if (shape)
                snprintf(what, sizeof what, "%s batch %lld seq 5 mask [%lld, %lld, %lld, %lld]", name,
                         (long long)batch, (long long)shape[0], (long long)shape[1], (long long)shape[2],
                         (long long)shape[3]);
            else
                snprintf(what, sizeof what, "%s batch %lld seq 5 mask without a shape", name, (long long)batch);
            check_verdicts(&a, &b, what);
            free(rt.calls);
            free(vt.calls);
        }
    }
    const int64_t mpe = layer->config.max_position_embeddings;
    const int64_t positions[][5] = {{0, 5, 6, 20, mpe - 1}, {0, 1, 2, 3, -1}, {0, 1, 2, 3, mpe}, {mpe + 7, 0, 1, 2, 3}};
    for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
        struct trace rt = {0}, vt = {0};
        struct verdict a, b;
        run_both(layer, v, 1, 5, NULL, NULL, positions[p], 1, &rt, &vt, &a, &b);
        char what[160];
        snprintf(what, sizeof what, "%s positions %lld %lld %lld %lld %lld", name, (long long)positions[p][0],
                 (long long)positions[p][1], (long long)positions[p][2], (long long)positions[p][3],
                 (long long)positions[p][4]);
        check_verdicts(&a, &b, what);
        free(rt.calls);
        free(vt.calls);
    }
}

/* ---- the cached forward: the runtime's paged cache vs the caller's caches ------- */

#define CACHED_SEQS 3
#define CACHED_CAPACITY 256

/* The vendored side's caller: each sequence's caches and length. */
struct caller_caches {
    float *k[CACHED_SEQS], *v[CACHED_SEQS];
    int64_t lengths[CACHED_SEQS];
};

/* The runtime gathers a tile's keys from its pages (strides of one head), the
 * vendored layer reads the caller's caches in place (strides of a cache row):
 * the only fields in which their attention calls differ. */
static void drop_kv_strides(struct trace *t)
{
    for (int64_t i = 0; i < t->count; i++)
        if (strncmp(t->calls[i].key, "attn_", 5) == 0)
            t->calls[i].k_stride = t->calls[i].v_stride = 0;
}

/* One cached call on both sides, sequences 0..n_seqs-1 of each; a side that
 * accepts it advances its lengths. */
static void run_both_cached(sneppx_layer *layer, sneppx_kv_cache *cache, const int64_t *seq_ids, struct vendored *v,
                            struct caller_caches *caller, int64_t n_seqs, const int64_t *q_lens,
                            const int64_t *positions, int threads, struct trace *rt, struct trace *vt,
                            struct verdict *runtime, struct verdict *vendored)
{
    int64_t tokens = 0;
    for (int64_t i = 0; i < n_seqs && i < CACHED_SEQS; i++)
        tokens += q_lens[i] > 0 && q_lens[i] <= CACHED_CAPACITY ? q_lens[i] : 0;
    tokens = tokens > 0 ? tokens : 1; /* the buffers of refused calls are never read */
    const int64_t hidden = layer->config.hidden_size;
    float *x = calloc((size_t)(tokens * hidden), sizeof(float));
    float *out = calloc((size_t)(tokens * hidden), sizeof(float));
    layer->config.num_threads = threads;
    mask_base = NULL;
    recording = rt;
    sneppx_status status = sneppx_layer_forward_cached(layer, cache, 0, n_seqs, seq_ids, q_lens, x, positions, NULL, out);
    runtime_verdict(runtime, status);

    const int64_t floats = v->cached_scratch_floats(tokens, CACHED_CAPACITY, threads);
    float *scratch = vendored_scratch(floats);
    recording = vt;
    current = v;
    const int code = scratch ? v->forward_cached(v->packed, n_seqs, q_lens, caller->lengths, caller->k,
                                                 layer->is_mla ? NULL : caller->v, CACHED_CAPACITY, x, positions, out,
                                                 scratch, threads)
                             : -1;
    vendored_verdict(vendored, v, code);
    for (int64_t i = 0; vendored->accepted && i < n_seqs; i++)
        caller->lengths[i] += q_lens[i];
    free(scratch);
    free(x);
    free(out);
}

/* The runtime's hint for default positions names its cache, then the ways past
 * max_position_embeddings; the vendored one stops at the cache. */
static void drop_cached_hint(struct verdict *runtime)
{
    char *at = runtime_hint(runtime->message, "; ");
    if (at)
        strcpy(at, ")");
}

static void check_cached(sneppx_layer *layer, struct vendored *v, const char *name)
{
    static const int64_t steps[][CACHED_SEQS] = {{130, 17, 20}, {17, 29, 70}, {40, 17, 18}};
    _Static_assert(17 > SNEPPX_DECODE_MAX_QUERIES, "the steps' runs take the gathered (flash) path");
    for (int threads = 1; threads <= 2; threads++) {
        sneppx_kv_cache_options options;
        sneppx_kv_cache_options_init(&options);
        options.capacity_tokens = CACHED_SEQS * (CACHED_CAPACITY + SNEPPX_KV_DEFAULT_PAGE_SIZE);
        sneppx_kv_cache *cache = NULL;
        if (!TEST_CHECK(&tally, sneppx_kv_cache_create(&layer->config, &options, &cache) == SNEPPX_OK, "%s: %s",
                        name, sneppx_last_error()))
            return;
        int64_t seq_ids[CACHED_SEQS];
        struct caller_caches caller;
        memset(&caller, 0, sizeof caller);
        const int64_t k_row = layer->is_mla ? layer->latent_dim : layer->kv_dim;
        for (int i = 0; i < CACHED_SEQS; i++) {
            TEST_CHECK(&tally, sneppx_kv_cache_add_sequence(cache, &seq_ids[i]) == SNEPPX_OK, "%s", sneppx_last_error());
            caller.k[i] = calloc((size_t)(CACHED_CAPACITY * k_row), sizeof(float));
            caller.v[i] = calloc((size_t)(CACHED_CAPACITY * k_row), sizeof(float));
        }
        for (size_t step = 0; step < sizeof steps / sizeof steps[0]; step++) {
            struct trace rt = {0}, vt = {0};
            struct verdict a, b;
            run_both_cached(layer, cache, seq_ids, v, &caller, CACHED_SEQS, steps[step], NULL, threads, &rt, &vt, &a,
                            &b);
            char what[200];
            snprintf(what, sizeof what, "%s cached step %zu (q_lens %lld %lld %lld) threads %d", name, step,
                     (long long)steps[step][0], (long long)steps[step][1], (long long)steps[step][2], threads);
            check_verdicts(&a, &b, what);
            drop_kv_strides(&rt);
            drop_kv_strides(&vt);
            if (a.accepted && b.accepted)
                check_same_calls(&rt, &vt, what);
            free(rt.calls);
            free(vt.calls);
        }
        /* Refused calls, on live sequences: the runtime's words. */
        const int64_t mpe = layer->config.max_position_embeddings;
        const struct {
            int64_t n_seqs, q_lens[2], positions[3];
        } refused[] = {{0, {1, 1}, {0}},
                       {((int64_t)1 << 26) + 1, {1, 1}, {0}},
                       {2, {2, 0}, {0}},
                       {2, {-4, 1}, {0}},
                       {2, {2, (int64_t)1 << 26}, {0}},
                       {2, {2, 1}, {200, -1, 201}},
                       {2, {1, 2}, {200, 201, mpe}},
                       {2, {1, 2}, {-1, -1, -1}}};
        for (size_t r = 0; r < sizeof refused / sizeof refused[0]; r++) {
            struct trace rt = {0}, vt = {0};
            struct verdict a, b;
            const int given = refused[r].positions[0] >= 0;
            run_both_cached(layer, cache, seq_ids, v, &caller, refused[r].n_seqs, refused[r].q_lens,
                            given ? refused[r].positions : NULL, threads, &rt, &vt, &a, &b);
            char what[200];
            snprintf(what, sizeof what, "%s cached n_seqs %lld q_lens %lld %lld positions %s", name,
                     (long long)refused[r].n_seqs, (long long)refused[r].q_lens[0], (long long)refused[r].q_lens[1],
                     given ? "given" : "NULL");
            drop_cached_hint(&a);
            check_verdicts(&a, &b, what);
            free(rt.calls);
            free(vt.calls);
        }
        for (int i = 0; i < CACHED_SEQS; i++) {
            free(caller.k[i]);
            free(caller.v[i]);
        }
        sneppx_kv_cache_destroy(cache);
    }
}

int main(void)
{
    for (int p = 0; p < sneppx_preset_count(); p++) {
        const char *name = sneppx_preset_name(p);
        const int failed_before = tally.failed;
        sneppx_config config;
        if (!TEST_CHECK(&tally, sneppx_config_from_name(name, NULL, &config) == SNEPPX_OK, "%s: %s", name,
                        sneppx_last_error()))
            continue;
        sneppx_layer *layer = NULL;
        if (!TEST_CHECK(&tally, sneppx_layer_create_unpacked(&config, &layer) == SNEPPX_OK, "%s: %s", name,
                        sneppx_last_error()))
            continue;
        struct vendored v = {0};
        if (replace_kernels(layer) && vendored_open(name, layer->target->name, &v)) {
            check_keys(layer, &v, name);
            check_tasks(layer, &v, name);
            check_sizes(layer, &v, name);
            check_masks_and_positions(layer, &v, name);
            check_cached(layer, &v, name);
        }
        vendored_close(&v);
        sneppx_layer_destroy(layer);
        printf("[%s] %s\n", name, tally.failed == failed_before ? "same keys, tasks and verdicts, cached too" : "FAILED");
        fflush(stdout);
    }
    return test_finish(&tally);
}
