/* Fuzzes the sharded-checkpoint loader: the input becomes
 * model.safetensors.index.json in a private directory that also holds two
 * valid shards ("model-00001-of-00002.safetensors": q/k/v_proj of layer 0,
 * "model-00002-of-00002.safetensors": o_proj), and sneppx_attn_weights_load()
 * reads layer 0 of a small GQA config from the directory. Promises: success
 * gives every tensor the config needs, each with the values its shard holds
 * for it (every element of tensor t is t + 1); failure leaves no weights and
 * has a message. sneppx_layer_create_from_safetensors(), which packs a layer from
 * the same files, succeeds exactly when the load does (a failure leaves no layer
 * and has a message), and its layer is the one sneppx_layer_create() makes
 * of the loaded tensors: the same output, bit for bit. (Shard names that leave
 * the directory are refused by the loader; the seeds hold such names for the
 * fuzzer to mutate.) */
#define _GNU_SOURCE
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "sneppx/layer.h"
#include "sneppx/safetensors.h"

static char dir[512], index_path[PATH_MAX];
static sneppx_config config;
static sneppx_attn_tensor layer_tensors[SNEPPX_ATTN_TENSORS_MAX]; /* the config's, in sneppx_attn_tensors' order */

/* Each tensor's every element holds its index + 1: a loader that reads another
 * tensor's bytes, another shard's or another offset's gives other values. */
static float tensor_value(int t) { return (float)(t + 1); }

static uint64_t element_count(const sneppx_attn_tensor *tensor)
{
    return (uint64_t)tensor->shape[0] * (uint64_t)(tensor->rank == 2 ? tensor->shape[1] : 1);
}

/* Writes a shard holding the tensors [first, last) of the config in BF16. */
static int write_shard(const char *name, const sneppx_attn_tensor *tensors, int first, int last)
{
    char header[2048] = "{\"__metadata__\":{\"format\":\"pt\"}";
    size_t used = strlen(header);
    uint64_t offset = 0;
    for (int t = first; t < last; t++) {
        const uint64_t elements = element_count(&tensors[t]);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 ",\"model.layers.0.self_attn.%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"
                                 "\"data_offsets\":[%llu,%llu]}", tensors[t].name, (long long)tensors[t].shape[0],
                                 (long long)tensors[t].shape[1], (unsigned long long)offset,
                                 (unsigned long long)(offset + 2 * elements));
        offset += 2 * elements;
    }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *stream = fopen(path, "wb");
    if (!stream || used >= sizeof header)
        return -1;
    uint8_t length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (uint8_t)((uint64_t)used >> (8 * i));
    int ok = fwrite(length, 1, 8, stream) == 8 && fwrite(header, 1, used, stream) == used;
    for (int t = first; t < last && ok; t++) {
        const float value = tensor_value(t);
        uint32_t bits;
        memcpy(&bits, &value, sizeof bits); /* a small integer: its bfloat16 is exact */
        const uint64_t elements = element_count(&tensors[t]);
        for (uint64_t i = 0; ok && i < elements; i++)
            ok = fputc((int)(bits >> 16 & 0xff), stream) != EOF && fputc((int)(bits >> 24), stream) != EOF;
    }
    return fclose(stream) == 0 && ok ? 0 : -1;
}

static void remove_directory(void)
{
    char path[PATH_MAX];
    const char *files[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sneppx_config_init(&config);
    config.hidden_size = 32, config.num_attention_heads = 2, config.num_key_value_heads = 1, config.head_dim = 16;
    config.qkv_bias = config.o_bias = 0;
    int count = 0;
    if (sneppx_attn_tensors(&config, layer_tensors, &count) != SNEPPX_OK || count != 4 ||
        fuzz_private_dir("sneppx-fuzz-checkpoint", dir, sizeof dir) != 0 ||
        write_shard("model-00001-of-00002.safetensors", layer_tensors, 0, 3) != 0 ||
        write_shard("model-00002-of-00002.safetensors", layer_tensors, 3, 4) != 0) {
        fprintf(stderr, "fuzz_checkpoint_index: cannot prepare the shards in %s\n", dir);
        exit(1);
    }
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    atexit(remove_directory);
    return 0;
}

/* The layer packed from the checkpoint against the one made of the loaded tensors. */
static void check_layer(sneppx_status loaded, const sneppx_weights *view)
{
    sneppx_layer *packed = (sneppx_layer *)&config; /* not NULL: a failure must clear it */
    const sneppx_status status = sneppx_layer_create_from_safetensors(&config, dir, 0, &packed);
    FUZZ_ASSERT((status == SNEPPX_OK) == (loaded == SNEPPX_OK),
                "the weights %s, the layer from the same files %s: %s", loaded == SNEPPX_OK ? "load" : "do not",
                status == SNEPPX_OK ? "is made" : "is not", sneppx_last_error());
    if (status != SNEPPX_OK) {
        FUZZ_ASSERT(!packed && sneppx_last_error()[0] != '\0', "a refused layer: status %d, layer %p, '%s'",
                    (int)status, (void *)packed, sneppx_last_error());
        return;
    }
    sneppx_layer *made = NULL;
    FUZZ_ASSERT(sneppx_layer_create(&config, view, &made) == SNEPPX_OK, "the layer of the loaded tensors: %s",
                sneppx_last_error());
    enum { TOKENS = 3 };
    static float hidden[TOKENS * 32], got[TOKENS * 32], want[TOKENS * 32];
    for (int i = 0; i < TOKENS * 32; i++)
        hidden[i] = (float)((i * 37) % 19 - 9) / 8.0f;
    FUZZ_ASSERT(sneppx_layer_forward(packed, 1, TOKENS, hidden, NULL, NULL, NULL, got) == SNEPPX_OK &&
                    sneppx_layer_forward(made, 1, TOKENS, hidden, NULL, NULL, NULL, want) == SNEPPX_OK,
                "forward: %s", sneppx_last_error());
    FUZZ_ASSERT(memcmp(got, want, sizeof got) == 0,
                "the layer packed from the checkpoint differs from the one made of its loaded tensors");
    sneppx_layer_destroy(packed);
    sneppx_layer_destroy(made);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *stream = fopen(index_path, "wb");
    FUZZ_ASSERT(stream && fwrite(data, 1, size, stream) == size && fclose(stream) == 0, "cannot write %s",
                index_path);
    sneppx_attn_weights *weights = NULL;
    sneppx_status status = sneppx_attn_weights_load(dir, 0, &config, &weights);
    if (status == SNEPPX_OK) {
        const sneppx_weights *view = sneppx_attn_weights_view(weights);
        FUZZ_ASSERT(view && view->q_proj_weight && view->k_proj_weight && view->v_proj_weight && view->o_proj_weight,
                    "a loaded layer lacks a tensor the config needs");
        for (int t = 0; t < 4; t++) {
            const float *values;
            memcpy(&values, (const char *)view + layer_tensors[t].weights_offset, sizeof values);
            for (uint64_t i = 0; i < element_count(&layer_tensors[t]); i++)
                FUZZ_ASSERT(values[i] == tensor_value(t), "%s[%llu] is %g, its shard holds %g", layer_tensors[t].name,
                            (unsigned long long)i, values[i], tensor_value(t));
        }
    } else {
        FUZZ_ASSERT(!weights && sneppx_last_error()[0] != '\0', "status %d without a message", (int)status);
    }
    check_layer(status, sneppx_attn_weights_view(weights));
    sneppx_attn_weights_free(weights);
    return 0;
}
