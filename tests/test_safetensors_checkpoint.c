/* Loading one layer's self_attn out of a checkpoint: a sharded checkpoint
 * (index.json + BF16 and F32 shards, prefix "model.layers.<L>.self_attn."),
 * a single file, a directory of shards without an index, a multimodal file
 * (a vision tower's self_attn beside the language model's); the tensor list of
 * GQA and MLA configs; and every error (missing, extra, mis-shaped, absent
 * layer, bad index, two complete prefixes), each naming the tensor or the file. */
#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sneppx/safetensors.h"
#include "test_util.h"

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    sneppx_last_error());                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define CHECK_ERROR(call, expected_status, needle)                                                 \
    do {                                                                                           \
        sneppx_status status_ = (call);                                                            \
        CHECK(status_ == (expected_status));                                                       \
        if (!strstr(sneppx_last_error(), (needle))) {                                              \
            fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__, sneppx_last_error(), \
                    (needle));                                                                     \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static char work_dir[256];

static const char *path_in(const char *relative)
{
    static char paths[4][512];
    static int next;
    char *path = paths[next++ % 4];
    snprintf(path, sizeof paths[0], "%s/%s", work_dir, relative);
    return path;
}

/* One tensor to write: its values are value_of(layer, seed, i), exact in BF16. */
struct tensor_out {
    char name[128];
    const char *dtype; /* "F32", "BF16" or "I32" */
    int rank;
    int64_t shape[2];
    int layer, seed;
};

static float value_of(int layer, int seed, int64_t i)
{
    return (float)((i * 7 + seed * 13 + layer * 5) % 61 - 30) * 0.25f;
}

static void write_shard(const char *path, const struct tensor_out *tensors, int count)
{
    char header[8192];
    size_t used = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (int t = 0; t < count; t++) {
        const struct tensor_out *tensor = &tensors[t];
        int64_t elements = tensor->shape[0] * (tensor->rank == 2 ? tensor->shape[1] : 1);
        uint64_t bytes = (uint64_t)elements * (strcmp(tensor->dtype, "BF16") == 0 ? 2 : 4);
        char shape[64];
        if (tensor->rank == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)tensor->shape[0], (long long)tensor->shape[1]);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)tensor->shape[0]);
        used += (size_t)snprintf(header + used, sizeof header - used,
                                 ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                                 tensor->name, tensor->dtype, shape, (unsigned long long)offset,
                                 (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    snprintf(header + used, sizeof header - used, "}");
    FILE *stream = fopen(path, "wb");
    if (!stream) {
        perror(path);
        exit(2);
    }
    uint64_t header_length = strlen(header);
    for (int i = 0; i < 8; i++)
        fputc((int)((header_length >> (8 * i)) & 0xff), stream);
    fputs(header, stream);
    for (int t = 0; t < count; t++) {
        const struct tensor_out *tensor = &tensors[t];
        int64_t elements = tensor->shape[0] * (tensor->rank == 2 ? tensor->shape[1] : 1);
        for (int64_t i = 0; i < elements; i++) {
            float value = value_of(tensor->layer, tensor->seed, i);
            uint32_t bits;
            memcpy(&bits, &value, sizeof bits);
            if (strcmp(tensor->dtype, "I32") == 0)
                bits = (uint32_t)(int32_t)value;
            int bytes = strcmp(tensor->dtype, "BF16") == 0 ? 2 : 4;
            if (bytes == 2)
                bits >>= 16; /* values are exact in bfloat16: its bits are the float's top half */
            for (int b = 0; b < bytes; b++)
                fputc((int)((bits >> (8 * b)) & 0xff), stream);
        }
    }
    fclose(stream);
}

/* The GQA test config: hidden 64, 4 heads, 2 kv heads, head_dim 16, q/k/v and o biases. */
static sneppx_config small_config(void)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 16;
    return config;
}

/* The config's tensors of `layer` under prefix, seeds = spec index, in dtype. */
static int layer_tensors(const sneppx_config *config, const char *prefix, int layer, const char *dtype,
                         struct tensor_out *out)
{
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    if (sneppx_attn_tensors(config, specs, &count) != SNEPPX_OK)
        return 0;
    for (int i = 0; i < count; i++) {
        snprintf(out[i].name, sizeof out[i].name, "%slayers.%d.self_attn.%s", prefix, layer, specs[i].name);
        out[i].dtype = dtype;
        out[i].rank = specs[i].rank;
        out[i].shape[0] = specs[i].shape[0];
        out[i].shape[1] = specs[i].shape[1];
        out[i].layer = layer;
        out[i].seed = i;
    }
    return count;
}

/* Every tensor of weights equals value_of(layer, spec index, i) and is 64-byte aligned. */
static void check_weights(const sneppx_config *config, const sneppx_attn_weights *weights, int layer)
{
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    CHECK(sneppx_attn_tensors(config, specs, &count) == SNEPPX_OK);
    const sneppx_weights *view = sneppx_attn_weights_view(weights);
    CHECK(view != NULL);
    if (!view)
        return;
    for (int t = 0; t < count; t++) {
        const float *data;
        memcpy(&data, (const char *)view + specs[t].weights_offset, sizeof data);
        CHECK(data != NULL && (uintptr_t)data % 64 == 0);
        int64_t elements = specs[t].shape[0] * (specs[t].rank == 2 ? specs[t].shape[1] : 1);
        int mismatches = 0;
        for (int64_t i = 0; data && i < elements; i++)
            mismatches += data[i] != value_of(layer, t, i);
        CHECK(mismatches == 0);
    }
}

static void write_index(const char *path, const struct tensor_out *tensors, const char *const *shards,
                        int count)
{
    FILE *stream = fopen(path, "w");
    fprintf(stream, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int t = 0; t < count; t++)
        fprintf(stream, "%s\"%s\": \"%s\"", t ? ", " : "", tensors[t].name, shards[t]);
    fprintf(stream, "}}\n");
    fclose(stream);
}

static void test_tensor_lists(void)
{
    sneppx_config config = small_config();
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    CHECK(sneppx_attn_tensors(&config, specs, &count) == SNEPPX_OK);
    CHECK(count == 8);
    CHECK(strcmp(specs[0].name, "q_proj.weight") == 0 && specs[0].shape[0] == 64 && specs[0].shape[1] == 64);
    CHECK(strcmp(specs[2].name, "k_proj.weight") == 0 && specs[2].shape[0] == 32 && specs[2].rank == 2);
    CHECK(strcmp(specs[3].name, "k_proj.bias") == 0 && specs[3].shape[0] == 32 && specs[3].rank == 1);
    CHECK(strcmp(specs[7].name, "o_proj.bias") == 0 && specs[7].weights_offset == offsetof(sneppx_weights, o_proj_bias));

    config.qkv_bias = config.o_bias = 0;
    CHECK(sneppx_attn_tensors(&config, specs, &count) == SNEPPX_OK && count == 4);

    /* DeepSeek V2 shapes, scaled down: rq 48, r 32, nope 16, rope 16, v 16, 2 heads. */
    sneppx_config mla = small_config();
    mla.num_attention_heads = mla.num_key_value_heads = 2;
    mla.q_lora_rank = 48;
    mla.kv_lora_rank = 32;
    mla.qk_nope_head_dim = 16;
    mla.qk_rope_head_dim = 16;
    mla.v_head_dim = 16;
    mla.qkv_bias = mla.o_bias = 0;
    const char *names[] = {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
                           "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                           "o_proj.weight"};
    const int64_t shapes[][2] = {{48, 64}, {48, 0}, {64, 48}, {48, 64}, {32, 0}, {64, 32}, {64, 32}};
    CHECK(sneppx_attn_tensors(&mla, specs, &count) == SNEPPX_OK && count == 7);
    for (int i = 0; i < 7 && i < count; i++)
        CHECK(strcmp(specs[i].name, names[i]) == 0 && specs[i].shape[0] == shapes[i][0] &&
              specs[i].shape[1] == shapes[i][1]);
    mla.q_lora_rank = 0; /* DeepSeek-V2-Lite: plain q_proj */
    CHECK(sneppx_attn_tensors(&mla, specs, &count) == SNEPPX_OK && count == 5);
    CHECK(strcmp(specs[0].name, "q_proj.weight") == 0 && specs[0].shape[0] == 64 && specs[0].shape[1] == 64);

    config.hidden_size = 0;
    CHECK_ERROR(sneppx_attn_tensors(&config, specs, &count), SNEPPX_ERR_INVALID_ARGUMENT, "hidden_size");
    CHECK(sneppx_attn_tensors(NULL, specs, &count) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_attn_tensor_is_ignored("rotary_emb.inv_freq") && !sneppx_attn_tensor_is_ignored("q_proj.weight"));
}

/* The index reader allocates what the file needs: a small index loads in a
 * child whose address space has only 32 MiB to spare (a 64 MiB buffer per
 * read, as before, fails there). ASan reserves terabytes of shadow memory,
 * so under it the check is skipped. */
static void test_index_memory(const char *dir, const sneppx_config *config)
{
#if TEST_UNDER_ASAN
    (void)dir, (void)config;
    fprintf(stderr, "test_index_memory: skipped under AddressSanitizer\n");
#else
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        unsigned long pages = 0;
        FILE *statm = fopen("/proc/self/statm", "r");
        if (!statm || fscanf(statm, "%lu", &pages) != 1)
            _exit(3);
        fclose(statm);
        struct rlimit limit;
        limit.rlim_cur = limit.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)32 << 20);
        if (setrlimit(RLIMIT_AS, &limit) != 0)
            _exit(3);
        sneppx_attn_weights *weights = NULL;
        sneppx_status status = sneppx_attn_weights_load(dir, 0, config, &weights);
        if (status != SNEPPX_OK)
            fprintf(stderr, "index load with 32 MiB of address space to spare: %s\n", sneppx_last_error());
        sneppx_attn_weights_free(weights);
        _exit(status == SNEPPX_OK ? 0 : 1);
    }
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

/* Index files that are not what they claim: larger than the bound (refused
 * before any read, naming the file), or a FIFO (refused, not a hang). */
static void test_index_files(const sneppx_config *config)
{
    sneppx_attn_weights *weights = NULL;
    const char *huge = path_in("huge.index.json");
    int fd = open(huge, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, ((off_t)64 << 20) + 1) == 0); /* sparse: no disk used */
    if (fd >= 0)
        close(fd);
    CHECK_ERROR(sneppx_attn_weights_load(huge, 0, config, &weights), SNEPPX_ERR_FORMAT, huge);
    CHECK(strstr(sneppx_last_error(), "67108865 bytes; a checkpoint index has at most 64 MiB") != NULL);
    CHECK(weights == NULL);
    unlink(huge);

    const char *fifo = path_in("fifo.index.json");
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(30); /* a blocking open would hang here */
    CHECK_ERROR(sneppx_attn_weights_load(fifo, 0, config, &weights), SNEPPX_ERR_FORMAT, "not a regular file");
    alarm(0);
    CHECK(weights == NULL);
    unlink(fifo);
}

/* Layers 0 and 1 over two shards: q/k/v in BF16 in the first, o and the other
 * layer in F32 in the second, plus unrelated tensors and an ignored buffer. */
static void test_sharded_checkpoint(void)
{
    sneppx_config config = small_config();
    struct tensor_out layer0[SNEPPX_ATTN_TENSORS_MAX], layer1[SNEPPX_ATTN_TENSORS_MAX];
    int count = layer_tensors(&config, "model.", 0, "BF16", layer0);
    CHECK(layer_tensors(&config, "model.", 1, "F32", layer1) == count && count == 8);
    struct tensor_out shard1[10], shard2[12], all[22];
    const char *shard_of[22];
    int n1 = 0, n2 = 0;
    shard1[n1++] = (struct tensor_out){"model.embed_tokens.weight", "F32", 2, {8, 64}, 0, 99};
    for (int i = 0; i < 6; i++)
        shard1[n1++] = layer0[i];
    for (int i = 6; i < 8; i++) {
        layer0[i].dtype = "F32";
        shard2[n2++] = layer0[i];
    }
    for (int i = 0; i < 8; i++)
        shard2[n2++] = layer1[i];
    shard2[n2++] = (struct tensor_out){"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", 1, {8, 0}, 0, 0};
    mkdir(path_in("sharded"), 0700);
    write_shard(path_in("sharded/model-00001-of-00002.safetensors"), shard1, n1);
    write_shard(path_in("sharded/model-00002-of-00002.safetensors"), shard2, n2);
    int n = 0;
    for (int i = 0; i < n1; i++, n++)
        all[n] = shard1[i], shard_of[n] = "model-00001-of-00002.safetensors";
    for (int i = 0; i < n2; i++, n++)
        all[n] = shard2[i], shard_of[n] = "model-00002-of-00002.safetensors";
    write_index(path_in("sharded/model.safetensors.index.json"), all, shard_of, n);

    sneppx_attn_weights *weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("sharded"), 0, &config, &weights) == SNEPPX_OK);
    check_weights(&config, weights, 0);
    sneppx_attn_weights_free(weights);
    weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("sharded/model.safetensors.index.json"), 1, &config, &weights) ==
          SNEPPX_OK);
    check_weights(&config, weights, 1);
    sneppx_attn_weights_free(weights);

    /* A single shard holds all of layer 1. */
    weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("sharded/model-00002-of-00002.safetensors"), 1, &config, &weights) ==
          SNEPPX_OK);
    check_weights(&config, weights, 1);
    sneppx_attn_weights_free(weights);

    CHECK_ERROR(sneppx_attn_weights_load(path_in("sharded"), 5, &config, &weights), SNEPPX_ERR_FORMAT,
                "no tensor of layer 5's self_attn");
    CHECK(weights == NULL);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("sharded/model-00001-of-00002.safetensors"), 0, &config, &weights),
                SNEPPX_ERR_FORMAT, "missing tensor 'model.layers.0.self_attn.o_proj.weight'");
    sneppx_config bigger = config;
    bigger.num_key_value_heads = 4;
    CHECK_ERROR(sneppx_attn_weights_load(path_in("sharded"), 0, &bigger, &weights), SNEPPX_ERR_FORMAT,
                "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 64], config 'custom' expects [64, 64]");
    sneppx_config no_bias = config;
    no_bias.qkv_bias = 0;
    CHECK_ERROR(sneppx_attn_weights_load(path_in("sharded"), 0, &no_bias, &weights), SNEPPX_ERR_FORMAT,
                "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'");
    /* From a directory the shard holding it is named too. */
    CHECK_ERROR(sneppx_attn_weights_load(path_in("sharded"), 0, &no_bias, &weights), SNEPPX_ERR_FORMAT,
                "unexpected tensor 'model.layers.0.self_attn.q_proj.bias' (");

    test_index_memory(path_in("sharded"), &config);
    test_index_files(&config);

    /* A directory of shards without an index works the same. */
    unlink(path_in("sharded/model.safetensors.index.json"));
    weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("sharded"), 0, &config, &weights) == SNEPPX_OK);
    check_weights(&config, weights, 0);
    sneppx_attn_weights_free(weights);
}

/* One file, another prefix; errors in single files; bad index entries. */
static void test_single_file_and_errors(void)
{
    sneppx_config config = small_config();
    struct tensor_out tensors[SNEPPX_ATTN_TENSORS_MAX + 1];
    int count = layer_tensors(&config, "language_model.model.", 2, "F32", tensors);
    mkdir(path_in("single"), 0700);
    write_shard(path_in("single/model.safetensors"), tensors, count);
    sneppx_attn_weights *weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("single"), 2, &config, &weights) == SNEPPX_OK);
    check_weights(&config, weights, 2);
    sneppx_attn_weights_free(weights);
    weights = NULL;

    tensors[count] = tensors[0];
    snprintf(tensors[count].name, sizeof tensors[count].name, "language_model.model.layers.2.self_attn.q_norm.weight");
    tensors[count].rank = 1;
    write_shard(path_in("extra.safetensors"), tensors, count + 1);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("extra.safetensors"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "unexpected tensor 'language_model.model.layers.2.self_attn.q_norm.weight'");
    /* A single file is named once (it used to follow as "(<the same path>)"). */
    char once[800];
    snprintf(once, sizeof once, "%s: unexpected tensor 'language_model.model.layers.2.self_attn.q_norm.weight': "
             "config 'custom' has", path_in("extra.safetensors"));
    CHECK_ERROR(sneppx_attn_weights_load(path_in("extra.safetensors"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                once);

    tensors[3].dtype = "I32";
    write_shard(path_in("int.safetensors"), tensors, count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("int.safetensors"), 2, &config, &weights), SNEPPX_ERR_UNSUPPORTED,
                "tensor 'language_model.model.layers.2.self_attn.k_proj.bias': dtype I32");
    tensors[3].dtype = "F32";

    /* Two files in one directory both carrying layer 2's q_proj. */
    mkdir(path_in("twice"), 0700);
    write_shard(path_in("twice/a.safetensors"), tensors, count);
    write_shard(path_in("twice/b.safetensors"), tensors, 1);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("twice"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "both match layer 2's self_attn.q_proj.weight");

    /* Index entries: a shard that does not exist, one without the tensor, one outside the directory. */
    const char *shards[SNEPPX_ATTN_TENSORS_MAX + 1];
    for (int i = 0; i <= count; i++)
        shards[i] = "model.safetensors";
    shards[1] = "gone.safetensors";
    write_index(path_in("single/broken.index.json"), tensors, shards, count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/broken.index.json"), 2, &config, &weights), SNEPPX_ERR_IO,
                "gone.safetensors");
    shards[1] = "model.safetensors";
    snprintf(tensors[count].name, sizeof tensors[count].name, "language_model.model.layers.2.self_attn.rotary_emb.inv_freq");
    write_index(path_in("single/ignored.index.json"), tensors, shards, count + 1);
    CHECK(sneppx_attn_weights_load(path_in("single/ignored.index.json"), 2, &config, &weights) == SNEPPX_OK);
    sneppx_attn_weights_free(weights);
    weights = NULL;
    write_shard(path_in("single/partial.safetensors"), tensors, 2);
    shards[5] = "partial.safetensors";
    write_index(path_in("single/wrong.index.json"), tensors, shards, count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/wrong.index.json"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "puts tensor 'language_model.model.layers.2.self_attn.v_proj.bias' in");
    shards[5] = "../single/model.safetensors";
    write_index(path_in("single/escape.index.json"), tensors, shards, count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/escape.index.json"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "is not a file name inside");
    /* ".." below a subdirectory climbs out all the same; so does an absolute name. */
    static const char *const escapes[] = {"sub/../../single/model.safetensors", "sub//..", "/etc/passwd"};
    for (int i = 0; i < 3; i++) {
        shards[5] = escapes[i];
        write_index(path_in("single/escape.index.json"), tensors, shards, count);
        CHECK_ERROR(sneppx_attn_weights_load(path_in("single/escape.index.json"), 2, &config, &weights),
                    SNEPPX_ERR_FORMAT, "v_proj.bias'] is not a file name inside");
    }
    /* A shard name with a control character (JSON's \u001b) would reach every later
     * message about the shard: refused, not echoed. */
    shards[5] = "red\\u001b[31m\\n.safetensors";
    write_index(path_in("single/control.index.json"), tensors, shards, count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/control.index.json"), 2, &config, &weights),
                SNEPPX_ERR_FORMAT, "v_proj.bias']: a shard name with a control character");
    CHECK(weights == NULL);
    /* A subdirectory without "..", and a name that only starts with "..", stay inside. */
    mkdir(path_in("single/sub"), 0700);
    write_shard(path_in("single/sub/..model.safetensors"), tensors, count);
    for (int i = 0; i < count; i++)
        shards[i] = "sub/./..model.safetensors";
    write_index(path_in("single/sub.index.json"), tensors, shards, count);
    CHECK(sneppx_attn_weights_load(path_in("single/sub.index.json"), 2, &config, &weights) == SNEPPX_OK);
    sneppx_attn_weights_free(weights);
    weights = NULL;
    for (int i = 0; i <= count; i++)
        shards[i] = "model.safetensors";
    /* An index naming more than 16 tensors per one the config needs under the layer's
     * pattern (every prefix counted) is refused by name before any shard is opened. */
    struct tensor_out many[16 * SNEPPX_ATTN_TENSORS_MAX + 1];
    const char *many_shards[16 * SNEPPX_ATTN_TENSORS_MAX + 1];
    const int many_count = 16 * SNEPPX_ATTN_TENSORS_MAX + 1;
    for (int i = 0; i < many_count; i++) {
        snprintf(many[i].name, sizeof many[i].name, "tower%d.layers.2.self_attn.q_proj.weight", i);
        many_shards[i] = "absent.safetensors";
    }
    write_index(path_in("single/many.index.json"), many, many_shards, many_count);
    char needle[96];
    snprintf(needle, sizeof needle, "more than %d tensors are named '...layers.2.self_attn.<name>'",
             16 * SNEPPX_ATTN_TENSORS_MAX);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/many.index.json"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                needle);
    FILE *stream = fopen(path_in("single/notjson.index.json"), "w");
    fputs("{\"weight_map\": [1, 2]}", stream);
    fclose(stream);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single/notjson.index.json"), 2, &config, &weights),
                SNEPPX_ERR_FORMAT, "\"weight_map\"");

    mkdir(path_in("empty"), 0700);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("empty"), 0, &config, &weights), SNEPPX_ERR_IO,
                "no model.safetensors.index.json and no *.safetensors file");
    CHECK_ERROR(sneppx_attn_weights_load(path_in("nowhere"), 0, &config, &weights), SNEPPX_ERR_IO, "nowhere");
    CHECK_ERROR(sneppx_attn_weights_load(path_in("single"), -1, &config, &weights), SNEPPX_ERR_INVALID_ARGUMENT,
                "layer -1");
    CHECK(sneppx_attn_weights_load(NULL, 0, &config, &weights) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_attn_weights_load(path_in("single"), 0, NULL, &weights) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_attn_weights_load(path_in("single"), 0, &config, NULL) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(weights == NULL && sneppx_attn_weights_view(NULL) == NULL);
    sneppx_attn_weights_free(NULL);
}

/* A multimodal checkpoint: a vision tower's encoder layers carry self_attn tensors too
 * (another prefix, other names and shapes), listed before the language model's. The
 * layer's are the one prefix that holds all the config needs; two such are ambiguous. */
static void test_multimodal_checkpoint(void)
{
    sneppx_config config = small_config();
    static const char *const vision[] = {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                         "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"};
    enum { VISION = sizeof vision / sizeof vision[0] };
    struct tensor_out tensors[VISION + 2 * SNEPPX_ATTN_TENSORS_MAX];
    for (int i = 0; i < VISION; i++) {
        struct tensor_out *t = &tensors[i];
        snprintf(t->name, sizeof t->name, "vision_tower.vision_model.encoder.layers.2.self_attn.%s", vision[i]);
        t->dtype = "F32";
        t->rank = strstr(vision[i], "weight") ? 2 : 1;
        t->shape[0] = 32, t->shape[1] = 32;
        t->layer = 7, t->seed = 100 + i;
    }
    const int count = layer_tensors(&config, "language_model.model.", 2, "F32", tensors + VISION);
    write_shard(path_in("llava.safetensors"), tensors, VISION + count);
    sneppx_attn_weights *weights = NULL;
    sneppx_status status = sneppx_attn_weights_load(path_in("llava.safetensors"), 2, &config, &weights);
    CHECK(status == SNEPPX_OK);
    if (status != SNEPPX_OK)
        fprintf(stderr, "  %s\n", sneppx_last_error());
    else
        check_weights(&config, weights, 2);
    sneppx_attn_weights_free(weights);
    weights = NULL;

    layer_tensors(&config, "model.language_model.", 2, "F32", tensors + VISION + count);
    write_shard(path_in("twice.safetensors"), tensors, VISION + 2 * count);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("twice.safetensors"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "tensors 'language_model.model.layers.2.self_attn.q_proj.weight'");
    CHECK_ERROR(sneppx_attn_weights_load(path_in("twice.safetensors"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "and 'model.language_model.layers.2.self_attn.q_proj.weight'");

    /* No complete prefix: the fuller one names what it lacks. */
    write_shard(path_in("partial.safetensors"), tensors, VISION + count - 1);
    CHECK_ERROR(sneppx_attn_weights_load(path_in("partial.safetensors"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "missing tensor 'language_model.model.layers.2.self_attn.o_proj.bias'");
}

/* An index whose tensor name hides a NUL in an escape: cJSON would read the name up to it. */
static void test_index_escapes(void)
{
    sneppx_config config = small_config();
    FILE *index = fopen(path_in("nul.index.json"), "w");
    CHECK(index != NULL);
    if (!index)
        return;
    fputs("{\"weight_map\": {\"model.layers.2.self_attn.q_proj.weight\\u0000.bak\": \"a.safetensors\"}}", index);
    fclose(index);
    sneppx_attn_weights *weights = NULL;
    CHECK_ERROR(sneppx_attn_weights_load(path_in("nul.index.json"), 2, &config, &weights), SNEPPX_ERR_FORMAT,
                "nul.index.json: byte 55: a NUL, a \\u escape");
}

/* MLA names round-trip (DeepSeek-V2 layout, scaled down) in BF16. */
static void test_mla_checkpoint(void)
{
    sneppx_config mla = small_config();
    mla.num_attention_heads = mla.num_key_value_heads = 2;
    mla.q_lora_rank = 48;
    mla.kv_lora_rank = 32;
    mla.qk_nope_head_dim = 16;
    mla.qk_rope_head_dim = 16;
    mla.v_head_dim = 16;
    mla.qkv_bias = 0;
    mla.o_bias = 0;
    struct tensor_out tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = layer_tensors(&mla, "model.", 0, "BF16", tensors);
    CHECK(count == 7);
    write_shard(path_in("mla.safetensors"), tensors, count);
    sneppx_attn_weights *weights = NULL;
    CHECK(sneppx_attn_weights_load(path_in("mla.safetensors"), 0, &mla, &weights) == SNEPPX_OK);
    check_weights(&mla, weights, 0);
    const sneppx_weights *view = sneppx_attn_weights_view(weights);
    CHECK(view && view->q_proj_weight == NULL && view->k_proj_weight == NULL && view->kv_b_proj_weight != NULL);
    sneppx_attn_weights_free(weights);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(work_dir, sizeof work_dir, "%s/sneppx-checkpoint-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(work_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_tensor_lists();
    test_sharded_checkpoint();
    test_single_file_and_errors();
    test_multimodal_checkpoint();
    test_index_escapes();
    test_mla_checkpoint();
    nftw(work_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (failures)
        fprintf(stderr, "test_safetensors_checkpoint: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
