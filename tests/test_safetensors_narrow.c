/* Layers packed straight from 16-bit tensors: sneppx_layer_create_from_safetensors
 * (a BF16, F16 or F32 file) and sneppx_layer_create_typed (bfloat16 / float16 bits
 * in memory) must pack exactly what the float32 route packs (the file widened by
 * sneppx_attn_weights_load, then sneppx_layer_create): the same panel bytes and
 * the same forward output, bit for bit, into float32, bfloat16 and float16
 * layers; a GQA shape whose fused q|k|v pack tasks straddle q and k, and
 * DeepSeek-V2-Lite's MLA (absorbed and naive). And the errors, naming the
 * tensor, the field and the dtype, and a file cut short while its rows are packed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layer_internal.h"
#include "sneppx/safetensors.h"
#include "test_util.h"
#include "weights.h"

static test_tally tally;

/* ---- a checkpoint of one layer, written here ----------------------------- */

struct tensor_bits {
    char name[128];
    const char *dtype;      /* "F32", "BF16", "F16", "I8" */
    int64_t rows, cols;     /* cols 1 for a rank-1 tensor */
    int rank;
    void *data;             /* the file's bytes: float, uint16_t or int8_t elements */
    int field;              /* its sneppx_weights field */
};

static int element_bytes(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 ? 4 : strcmp(dtype, "I8") == 0 ? 1 : 2;
}

/* Random finite 16-bit values of magnitude about 2^-6 .. 2^1 (bfloat16 or binary16
 * bits), or float32 values; sign random. */
static void fill_tensor(struct tensor_bits *t, test_rng *rng)
{
    const int64_t n = t->rows * t->cols;
    t->data = malloc((size_t)(n * element_bytes(t->dtype)));
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = test_rng_next(rng);
        if (strcmp(t->dtype, "BF16") == 0)
            ((uint16_t *)t->data)[i] = (uint16_t)((r & 0x8000u) | (0x3c80u + ((r >> 16) % 0x380u)));
        else if (strcmp(t->dtype, "F16") == 0)
            ((uint16_t *)t->data)[i] = (uint16_t)((r & 0x8000u) | (0x2400u + ((r >> 16) % 0x1c00u)));
        else if (strcmp(t->dtype, "F32") == 0)
            ((float *)t->data)[i] = test_rng_symmetric(rng, 2.0f);
        else
            ((int8_t *)t->data)[i] = (int8_t)(r & 0x7f);
    }
}

/* The config's tensors of layer 0, all in dtype (little-endian host). */
static int make_tensors(const sneppx_config *config, const char *dtype, uint64_t seed, struct tensor_bits *out)
{
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    if (sneppx_attn_tensors(config, specs, &count) != SNEPPX_OK)
        return 0;
    test_rng rng = test_rng_seeded(seed);
    for (int i = 0; i < count; i++) {
        snprintf(out[i].name, sizeof out[i].name, "model.layers.0.self_attn.%s", specs[i].name);
        out[i].dtype = dtype;
        out[i].rank = specs[i].rank;
        out[i].rows = specs[i].shape[0];
        out[i].cols = specs[i].rank == 2 ? specs[i].shape[1] : 1;
        out[i].field = (int)(specs[i].weights_offset / sizeof(const float *));
        fill_tensor(&out[i], &rng);
    }
    return count;
}

static void free_tensors(struct tensor_bits *tensors, int count)
{
    for (int i = 0; i < count; i++)
        free(tensors[i].data);
}

static void write_file(const char *path, const struct tensor_bits *tensors, int count)
{
    char header[8192];
    size_t used = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (int t = 0; t < count; t++) {
        const uint64_t bytes = (uint64_t)(tensors[t].rows * tensors[t].cols * element_bytes(tensors[t].dtype));
        char shape[64];
        if (tensors[t].rank == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)tensors[t].rows, (long long)tensors[t].cols);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)tensors[t].rows);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                                 tensors[t].name, tensors[t].dtype, shape, (unsigned long long)offset,
                                 (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    snprintf(header + used, sizeof header - used, "}");
    FILE *stream = fopen(path, "wb");
    if (!stream) {
        perror(path);
        exit(2);
    }
    const uint64_t length = strlen(header);
    fwrite(&length, 8, 1, stream); /* little-endian host */
    fputs(header, stream);
    for (int t = 0; t < count; t++)
        fwrite(tensors[t].data, (size_t)element_bytes(tensors[t].dtype), (size_t)(tensors[t].rows * tensors[t].cols),
               stream);
    fclose(stream);
}

/* ---- comparing two layers ------------------------------------------------- */

static int same_gemm(const struct sneppx_packed_gemm *a, const struct sneppx_packed_gemm *b)
{
    if (a->panel_bytes != b->panel_bytes || a->instances != b->instances || (!a->panels) != (!b->panels) ||
        (!a->bias) != (!b->bias))
        return 0;
    if (a->panels && memcmp(a->panels, b->panels, (size_t)(a->panel_bytes * a->instances)) != 0)
        return 0;
    return !a->bias || memcmp(a->bias, b->bias, sizeof(float) * (size_t)a->n) == 0;
}

static int same_vector(const float *a, const float *b, int64_t n)
{
    return (!a) == (!b) && (!a || memcmp(a, b, sizeof(float) * (size_t)n) == 0);
}

/* Every packed byte and the forward output of 2 x 5 tokens, bit for bit. */
static void check_same_layers(const char *what, const sneppx_layer *got, const sneppx_layer *want)
{
    const sneppx_config *c = &want->config;
    const struct sneppx_packed_gemm *gemms_got[] = {&got->qkv_proj, &got->o_proj, &got->q_a_proj, &got->kv_a_proj,
                                                     &got->kv_b_proj, &got->absorb_uk, &got->absorb_uv};
    const struct sneppx_packed_gemm *gemms_want[] = {&want->qkv_proj, &want->o_proj, &want->q_a_proj,
                                                      &want->kv_a_proj, &want->kv_b_proj, &want->absorb_uk,
                                                      &want->absorb_uv};
    int packed_gemms = 0;
    for (size_t g = 0; g < sizeof gemms_got / sizeof gemms_got[0]; g++) {
        TEST_CHECK(&tally, same_gemm(gemms_got[g], gemms_want[g]), "%s: packed gemm %zu (%s) differs", what, g,
                   gemms_want[g]->kernel ? gemms_want[g]->kernel->key : "none");
        packed_gemms += gemms_want[g]->panels != NULL;
    }
    TEST_CHECK(&tally, packed_gemms >= 2, "%s: %d packed gemms compared", what, packed_gemms);
    TEST_CHECK(&tally,
               same_vector(got->q_a_norm_weight, want->q_a_norm_weight, c->q_lora_rank) &&
                   same_vector(got->kv_a_norm_weight, want->kv_a_norm_weight, c->kv_lora_rank),
               "%s: norm weights differ", what);

    const int64_t batch = 2, seq = 5, n = batch * seq * c->hidden_size;
    float *x = malloc(sizeof(float) * (size_t)n), *y_got = malloc(sizeof(float) * (size_t)n),
          *y_want = malloc(sizeof(float) * (size_t)n);
    test_rng rng = test_rng_seeded(11);
    test_fill_uniform(&rng, x, n, 1.0f);
    const int ok = sneppx_layer_forward((sneppx_layer *)got, batch, seq, x, NULL, NULL, NULL, y_got) == SNEPPX_OK &&
                   sneppx_layer_forward((sneppx_layer *)want, batch, seq, x, NULL, NULL, NULL, y_want) == SNEPPX_OK;
    TEST_CHECK(&tally, ok, "%s: forward: %s", what, sneppx_last_error());
    int finite = 1;
    for (int64_t i = 0; i < n; i++)
        finite &= y_want[i] == y_want[i];
    TEST_CHECK(&tally, ok && finite && memcmp(y_got, y_want, sizeof(float) * (size_t)n) == 0,
               "%s: forward output differs from the float32 route's", what);
    free(x), free(y_got), free(y_want);
}

/* The float32 route: the file widened to float32 copies, then sneppx_layer_create. */
static sneppx_layer *via_float32(const sneppx_config *config, const char *path)
{
    sneppx_attn_weights *weights = NULL;
    sneppx_layer *layer = NULL;
    if (sneppx_attn_weights_load(path, 0, config, &weights) == SNEPPX_OK)
        sneppx_layer_create(config, sneppx_attn_weights_view(weights), &layer);
    TEST_CHECK(&tally, layer != NULL, "float32 route of %s: %s", path, sneppx_last_error());
    sneppx_attn_weights_free(weights);
    return layer;
}

static sneppx_typed_weights typed_of(const struct tensor_bits *tensors, int count, sneppx_dtype dtype)
{
    sneppx_typed_weights typed;
    memset(&typed, 0, sizeof typed);
    sneppx_tensor_ref *refs = (sneppx_tensor_ref *)&typed;
    for (int i = 0; i < count; i++) {
        refs[tensors[i].field].data = tensors[i].data;
        refs[tensors[i].field].dtype = dtype;
    }
    return typed;
}

static const char *const file_dtypes[] = {"BF16", "F16", "F32"};
static const sneppx_dtype memory_dtypes[] = {SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_FLOAT16, SNEPPX_DTYPE_FLOAT32};

/* Every file dtype into every layer dtype, from the file and from memory. */
static void check_config(const char *label, sneppx_config config, const char *dir)
{
    for (int f = 0; f < 3; f++) {
        struct tensor_bits tensors[SNEPPX_ATTN_TENSORS_MAX];
        const int count = make_tensors(&config, file_dtypes[f], 100 + (uint64_t)f, tensors);
        char path[512];
        snprintf(path, sizeof path, "%s/%s-%s.safetensors", dir, label, file_dtypes[f]);
        write_file(path, tensors, count);
        const sneppx_typed_weights typed = typed_of(tensors, count, memory_dtypes[f]);
        for (int d = 0; d < 3; d++) {
            config.weight_dtype = (sneppx_dtype)d;
            char what[160];
            snprintf(what, sizeof what, "%s %s file -> %s layer", label, file_dtypes[f], sneppx_dtype_name(d));
            sneppx_layer *want = via_float32(&config, path), *from_file = NULL, *from_memory = NULL;
            TEST_CHECK(&tally, sneppx_layer_create_from_safetensors(&config, path, 0, &from_file) == SNEPPX_OK,
                       "%s: from_safetensors: %s", what, sneppx_last_error());
            TEST_CHECK(&tally, sneppx_layer_create_typed(&config, &typed, &from_memory) == SNEPPX_OK,
                       "%s: typed: %s", what, sneppx_last_error());
            if (want && from_file)
                check_same_layers(what, from_file, want);
            if (want && from_memory) {
                strncat(what, " (typed, in memory)", sizeof what - strlen(what) - 1);
                check_same_layers(what, from_memory, want);
            }
            sneppx_layer_destroy(want);
            sneppx_layer_destroy(from_file);
            sneppx_layer_destroy(from_memory);
        }
        unlink(path);
        free_tensors(tensors, count);
    }
}

static void test_gqa(const char *dir)
{
    /* q 3 x 32 = 96 rows, k and v 32: the pack task of rows [64, 128) takes 32 rows of q and
     * all of k; biases on both sides. */
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 128;
    config.num_attention_heads = 3;
    config.num_key_value_heads = 1;
    config.head_dim = 32;
    check_config("gqa", config, dir);
}

static void test_mla(const char *dir)
{
    sneppx_config config;
    TEST_CHECK(&tally, sneppx_config_from_name("deepseek-v2-lite", NULL, &config) == SNEPPX_OK, "preset: %s",
               sneppx_last_error());
    config.num_threads = 2;
    struct tensor_bits tensors[SNEPPX_ATTN_TENSORS_MAX];
    const int count = make_tensors(&config, "BF16", 7, tensors);
    char path[512];
    snprintf(path, sizeof path, "%s/deepseek-v2-lite.safetensors", dir);
    write_file(path, tensors, count);
    for (int naive = 0; naive < 2; naive++) {
        config.mla_naive = naive;
        config.weight_dtype = SNEPPX_DTYPE_BFLOAT16;
        char what[96];
        snprintf(what, sizeof what, "deepseek-v2-lite BF16 file -> bfloat16 layer, %s", naive ? "naive" : "absorbed");
        sneppx_layer *want = via_float32(&config, path), *got = NULL;
        TEST_CHECK(&tally, sneppx_layer_create_from_safetensors(&config, path, 0, &got) == SNEPPX_OK, "%s: %s", what,
                   sneppx_last_error());
        if (want && got)
            check_same_layers(what, got, want);
        sneppx_layer_destroy(want);
        sneppx_layer_destroy(got);
    }
    unlink(path);
    free_tensors(tensors, count);
}

/* call fails with the status, leaves the layer NULL and names what is wrong. */
#define CHECK_ERROR(call, expected_status, needle)                                                             \
    do {                                                                                                       \
        const sneppx_status status_ = (call);                                                                  \
        TEST_CHECK(&tally, status_ == (expected_status) && layer == NULL && strstr(sneppx_last_error(), needle), \
                   "%s: status %s, message '%s', expected '%s'", #call, sneppx_status_name(status_),             \
                   sneppx_last_error(), needle);                                                               \
    } while (0)

/* The file (q, k, v, o: BF16, no biases) cut short after it was opened, in v_proj:
 * the pack task that reads v's rows fails on a worker thread, and the create fails
 * with SNEPPX_ERR_IO naming the file and the tensor, making no layer. */
static void test_truncated_while_packing(const sneppx_config *config, const char *path)
{
    sneppx_safetensors *file = NULL;
    if (sneppx_safetensors_open(path, &file) != SNEPPX_OK) {
        TEST_CHECK(&tally, 0, "open %s: %s", path, sneppx_last_error());
        return;
    }
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    sneppx_attn_tensors(config, specs, &count);
    for (int i = 0; i < count; i++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.0.self_attn.%s", specs[i].name);
        struct sneppx_weight_source *source = &sources[specs[i].weights_offset / sizeof(const float *)];
        source->kind = SNEPPX_SOURCE_FILE;
        source->file = file;
        source->index = sneppx_safetensors_find(file, name);
    }
    struct stat st;
    const off_t o_bytes = (off_t)(config->hidden_size * config->hidden_size * 2);
    TEST_CHECK(&tally, stat(path, &st) == 0 && truncate(path, st.st_size - o_bytes - 64) == 0, "truncate %s",
               path);
    sneppx_layer *layer = NULL;
    const sneppx_status status = sneppx_layer_create_from_sources(config, sources, &layer);
    TEST_CHECK(&tally, status == SNEPPX_ERR_IO && layer == NULL &&
                           strstr(sneppx_last_error(), path) &&
                           strstr(sneppx_last_error(), "tensor 'model.layers.0.self_attn.v_proj.weight'") &&
                           strstr(sneppx_last_error(), "truncated"),
               "a pack reading a file cut short: %s, '%s'", sneppx_status_name(status), sneppx_last_error());
    sneppx_layer_destroy(layer);
    sneppx_safetensors_close(file);
}

static void test_errors(const char *dir)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 16;
    config.qkv_bias = config.o_bias = 0;
    sneppx_layer *layer = NULL;

    /* A tensor of a dtype that does not widen: named with its dtype, before anything is packed. */
    struct tensor_bits tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = make_tensors(&config, "BF16", 3, tensors);
    free(tensors[1].data);
    tensors[1].dtype = "I8";
    fill_tensor(&tensors[1], &(test_rng){5});
    char path[512];
    snprintf(path, sizeof path, "%s/int8.safetensors", dir);
    write_file(path, tensors, count);
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&config, path, 0, &layer), SNEPPX_ERR_UNSUPPORTED,
                "tensor 'model.layers.0.self_attn.k_proj.weight': dtype I8 does not convert");
    unlink(path);
    free_tensors(tensors, count);

    count = make_tensors(&config, "BF16", 3, tensors);
    snprintf(path, sizeof path, "%s/ok.safetensors", dir);
    write_file(path, tensors, count);
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&config, NULL, 0, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "sneppx_layer_create_from_safetensors: path is NULL");
    CHECK_ERROR(sneppx_layer_create_from_safetensors(NULL, path, 0, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "sneppx_layer_create_from_safetensors: config is NULL");
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&config, path, -1, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "layer -1 is negative");
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&config, path, 0, NULL), SNEPPX_ERR_INVALID_ARGUMENT,
                "sneppx_layer_create_from_safetensors: layer is NULL");
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&config, path, 1, &layer), SNEPPX_ERR_FORMAT,
                "no tensor of layer 1's self_attn");
    sneppx_config biased = config;
    biased.o_bias = 1;
    CHECK_ERROR(sneppx_layer_create_from_safetensors(&biased, path, 0, &layer), SNEPPX_ERR_FORMAT,
                "missing tensor 'model.layers.0.self_attn.o_proj.bias'");

    sneppx_typed_weights typed = typed_of(tensors, count, SNEPPX_DTYPE_BFLOAT16);
    CHECK_ERROR(sneppx_layer_create_typed(&config, NULL, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "weights: must not be NULL");
    CHECK_ERROR(sneppx_layer_create_typed(NULL, &typed, &layer), SNEPPX_ERR_INVALID_ARGUMENT, "config: must not");
    CHECK_ERROR(sneppx_layer_create_typed(&config, &typed, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "output pointer");
    typed.k_proj_weight.dtype = (sneppx_dtype)77;
    CHECK_ERROR(sneppx_layer_create_typed(&config, &typed, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "weights.k_proj_weight.dtype: 77 is not a type tensors are read in (float32, bfloat16, float16)");
    typed.k_proj_weight.dtype = SNEPPX_DTYPE_BFLOAT16;
    typed.v_proj_weight.data = (const char *)tensors[2].data + 1;
    CHECK_ERROR(sneppx_layer_create_typed(&config, &typed, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "weights.v_proj_weight.data: bfloat16 elements at an odd address");
    typed.v_proj_weight.data = NULL;
    CHECK_ERROR(sneppx_layer_create_typed(&config, &typed, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "weights.v_proj_weight: NULL, but this config needs v_proj.weight [32 x 64]");
    typed.v_proj_weight.data = tensors[2].data;
    typed.q_a_proj_weight.data = tensors[0].data;
    CHECK_ERROR(sneppx_layer_create_typed(&config, &typed, &layer), SNEPPX_ERR_INVALID_ARGUMENT,
                "weights.q_a_proj_weight: given, but this config has no such tensor");
    typed.q_a_proj_weight.data = NULL;
    TEST_CHECK(&tally, sneppx_layer_create_typed(&config, &typed, &layer) == SNEPPX_OK && layer,
               "typed weights after the errors: %s", sneppx_last_error());
    sneppx_layer_destroy(layer);
    layer = NULL;
    test_truncated_while_packing(&config, path);
    unlink(path);
    free_tensors(tensors, count);
}

int main(void)
{
    char dir[] = "/tmp/sneppx-narrow-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_gqa(dir);
    test_mla(dir);
    test_errors(dir);
    rmdir(dir);
    return test_finish(&tally);
}
