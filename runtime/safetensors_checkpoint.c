/* One layer's self_attn tensors out of a HF checkpoint: resolves the
 * directory / index / shards, opens only the shards that hold the layer,
 * checks names and shapes against the config, and either converts them to
 * float32 copies (sneppx_attn_weights_load) or packs a layer from the files
 * (sneppx_layer_create_from_safetensors). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "json_text.h"
#include "regular_file.h"
#include "safetensors_internal.h"
#include "shard_create.h"
#include "sneppx/safetensors.h"
#include "weights.h"

/* Index files of the largest public checkpoints are a few hundred KiB (one
 * line per tensor; a few MiB for mixtures of experts with tens of thousands).
 * The bound refuses anything else before allocating; a file within it gets a
 * buffer of its own size. */
#define INDEX_MAX_BYTES (64u << 20)
/* Each tensor's buffer starts on a cache line (and a zmm register). */
#define TENSOR_ALIGN_FLOATS 16

struct sneppx_attn_weights {
    sneppx_weights view;
    float *storage;
};

struct shard_set {
    char **paths;
    sneppx_safetensors **files; /* NULL until the shard is needed */
    int count;
};

struct found_tensor {
    char *name;   /* full name in the checkpoint */
    int shard;
};

/* A tensor named "<prefix>layers.<L>.self_attn.<suffix>": the layer's, or another
 * tower's of a multimodal checkpoint, until choose_prefix decides. */
struct candidate {
    char *name;
    int shard;
    size_t prefix_len;
};

/* More than a few prefixes' worth of one layer's tensors is no checkpoint sneppx reads
 * (and the prefix grouping is quadratic in them). */
enum { MAX_CANDIDATES = 16 * SNEPPX_ATTN_TENSORS_MAX };

struct loader {
    const char *path;          /* what the caller passed */
    const sneppx_config *config;
    int64_t layer;
    char pattern[48];          /* "layers.<L>.self_attn." */
    sneppx_attn_tensor specs[SNEPPX_ATTN_TENSORS_MAX];
    int spec_count;
    struct found_tensor found[SNEPPX_ATTN_TENSORS_MAX];
    struct candidate candidates[MAX_CANDIDATES];
    int candidate_count;
    struct shard_set shards;
};

static int has_suffix(const char *text, const char *suffix)
{
    size_t text_len = strlen(text), suffix_len = strlen(suffix);
    return text_len >= suffix_len && strcmp(text + text_len - suffix_len, suffix) == 0;
}

static char *join_path(const char *dir, const char *name)
{
    size_t size = strlen(dir) + strlen(name) + 2;
    char *joined = malloc(size);
    if (joined)
        snprintf(joined, size, "%s/%s", dir, name);
    return joined;
}

static char *parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static int is_regular_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Index of path in the set, adding it (unopened) if new; -1 when out of memory. */
static int shard_add(struct shard_set *shards, const char *path)
{
    for (int i = 0; i < shards->count; i++)
        if (strcmp(shards->paths[i], path) == 0)
            return i;
    char **paths = realloc(shards->paths, (size_t)(shards->count + 1) * sizeof *paths);
    if (!paths)
        return -1;
    shards->paths = paths;
    sneppx_safetensors **files = realloc(shards->files, (size_t)(shards->count + 1) * sizeof *files);
    if (!files)
        return -1;
    shards->files = files;
    if (!(shards->paths[shards->count] = strdup(path)))
        return -1;
    shards->files[shards->count] = NULL;
    return shards->count++;
}

static sneppx_status shard_open(struct shard_set *shards, int shard)
{
    if (shards->files[shard])
        return SNEPPX_OK;
    return sneppx_safetensors_open(shards->paths[shard], &shards->files[shard]);
}

static void shards_close(struct shard_set *shards)
{
    for (int i = 0; i < shards->count; i++) {
        sneppx_safetensors_close(shards->files[i]);
        free(shards->paths[i]);
    }
    free(shards->paths);
    free(shards->files);
}

/* The HF name inside self_attn when full_name is "<prefix>layers.<L>.self_attn.<name>"
 * with an empty prefix or one ending in '.', else NULL. */
static const char *layer_suffix(const struct loader *loader, const char *full_name)
{
    size_t pattern_len = strlen(loader->pattern);
    for (const char *at = strstr(full_name, loader->pattern); at; at = strstr(at + 1, loader->pattern))
        if (at == full_name || at[-1] == '.')
            return at + pattern_len;
    return NULL;
}

static void expected_names(const struct loader *loader, char *text, size_t size)
{
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < loader->spec_count && used < size; i++)
        used += (size_t)snprintf(text + used, size - used, "%s%s", i ? ", " : "", loader->specs[i].name);
}

/* Records full_name (held in shard) if it names a self_attn tensor of the layer
 * under any prefix; choose_prefix picks the layer's among them once all are seen. */
static sneppx_status consider(struct loader *loader, const char *full_name, int shard)
{
    const char *suffix = layer_suffix(loader, full_name);
    if (!suffix || sneppx_attn_tensor_is_ignored(suffix))
        return SNEPPX_OK;
    if (loader->candidate_count == MAX_CANDIDATES)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: more than %d tensors are named '...%s<name>'", loader->path,
                           MAX_CANDIDATES, loader->pattern);
    struct candidate *c = &loader->candidates[loader->candidate_count];
    if (!(c->name = strdup(full_name)))
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", loader->path);
    c->shard = shard;
    c->prefix_len = (size_t)(suffix - full_name) - strlen(loader->pattern);
    loader->candidate_count++;
    return SNEPPX_OK;
}

static const char *candidate_suffix(const struct loader *loader, const struct candidate *c)
{
    return c->name + c->prefix_len + strlen(loader->pattern);
}

static int same_prefix(const struct candidate *a, const struct candidate *b)
{
    return a->prefix_len == b->prefix_len && strncmp(a->name, b->name, a->prefix_len) == 0;
}

/* The candidate of prefix `of` whose suffix is name, or -1. */
static int find_candidate(const struct loader *loader, const struct candidate *of, const char *name)
{
    for (int d = 0; d < loader->candidate_count; d++)
        if (same_prefix(&loader->candidates[d], of) &&
            strcmp(candidate_suffix(loader, &loader->candidates[d]), name) == 0)
            return d;
    return -1;
}

static sneppx_status both_match(const struct loader *loader, const char *a, int a_shard, const char *b, int b_shard,
                                const char *suffix)
{
    return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensors '%s' (%s) and '%s' (%s) both match layer %lld's self_attn.%s",
                       loader->path, a, loader->shards.paths[a_shard], b, loader->shards.paths[b_shard],
                       (long long)loader->layer, suffix);
}

/* The layer's tensors are one prefix's: a multimodal checkpoint holds its language
 * model's ("language_model.model.layers.<L>.self_attn.q_proj.weight") beside a
 * vision tower's ("vision_tower.vision_model.encoder.layers.<L>.self_attn.q_proj.weight").
 * The prefix that holds every tensor the config needs is the layer's; two such are
 * ambiguous; with none, the one holding the most names the missing tensors. In the
 * chosen prefix, a tensor the config does not take is an error (a config that does
 * not match the checkpoint); other prefixes' tensors are passed over. */
static sneppx_status choose_prefix(struct loader *loader)
{
    int chosen = -1, chosen_matches = -1, complete = -1;
    for (int c = 0; c < loader->candidate_count; c++) {
        const struct candidate *group = &loader->candidates[c];
        int first_of_prefix = 1; /* each prefix once, at its first candidate */
        for (int d = 0; d < c && first_of_prefix; d++)
            first_of_prefix = !same_prefix(&loader->candidates[d], group);
        if (!first_of_prefix)
            continue;
        int matches = 0;
        for (int i = 0; i < loader->spec_count; i++)
            matches += find_candidate(loader, group, loader->specs[i].name) >= 0;
        if (matches == loader->spec_count) {
            if (complete >= 0) {
                const char *name = loader->specs[0].name;
                const struct candidate *a =
                    &loader->candidates[find_candidate(loader, &loader->candidates[complete], name)];
                const struct candidate *b = &loader->candidates[find_candidate(loader, group, name)];
                return both_match(loader, a->name, a->shard, b->name, b->shard, name);
            }
            complete = c;
        }
        if (matches > chosen_matches)
            chosen = c, chosen_matches = matches;
    }
    if (complete >= 0)
        chosen = complete;
    if (chosen < 0)
        return SNEPPX_OK; /* no tensor of the layer: check_found says so */
    /* A copy: the names move to found[] below (and stay alive there). */
    const struct candidate group = loader->candidates[chosen];
    for (int d = 0; d < loader->candidate_count; d++) {
        const struct candidate *c = &loader->candidates[d];
        if (!c->name || !same_prefix(c, &group))
            continue;
        const char *suffix = candidate_suffix(loader, c);
        int spec = 0;
        while (spec < loader->spec_count && strcmp(loader->specs[spec].name, suffix) != 0)
            spec++;
        if (spec == loader->spec_count) {
            char expected[512];
            expected_names(loader, expected, sizeof expected);
            /* The shard is named only when it is not the path itself (a single file). */
            const char *shard_path = loader->shards.paths[c->shard];
            const int same_file = strcmp(shard_path, loader->path) == 0;
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: unexpected tensor '%s'%s%s%s: config '%s' has %s", loader->path,
                               c->name, same_file ? "" : " (", same_file ? "" : shard_path, same_file ? "" : ")",
                               loader->config->name, expected);
        }
        const struct found_tensor *found = &loader->found[spec];
        if (found->name) /* one name in two shards of a directory */
            return both_match(loader, found->name, found->shard, c->name, c->shard, suffix);
        loader->found[spec].name = c->name;
        loader->found[spec].shard = c->shard;
        loader->candidates[d].name = NULL; /* found[] owns it now */
    }
    return SNEPPX_OK;
}

/* A shard name from an index must stay inside the checkpoint directory. */
static int safe_shard_name(const char *name)
{
    if (name[0] == '\0' || name[0] == '/')
        return 0;
    for (const char *part = name; part; part = strchr(part, '/')) {
        if (*part == '/')
            part++;
        if (strncmp(part, "..", 2) == 0 && (part[2] == '/' || part[2] == '\0'))
            return 0;
    }
    return 1;
}

/* The whole index file, NUL-terminated, in a buffer of its own size (from
 * fstat) plus one byte; files larger than INDEX_MAX_BYTES are refused. */
static char *read_small_file(const char *path, size_t *size, sneppx_status *status)
{
    struct stat st;
    int not_regular;
    int fd = sneppx_open_regular(path, &st, &not_regular);
    if (fd < 0) {
        *status = not_regular ? sneppx_fail(SNEPPX_ERR_FORMAT, "%s: not a regular file", path)
                              : sneppx_fail(SNEPPX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if ((uint64_t)st.st_size > INDEX_MAX_BYTES) {
        close(fd);
        *status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: %lld bytes; a checkpoint index has at most %u MiB", path,
                              (long long)st.st_size, INDEX_MAX_BYTES >> 20);
        return NULL;
    }
    const size_t expected = (size_t)st.st_size;
    char *text = malloc(expected + 1);
    if (!text) {
        close(fd);
        *status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, expected);
        return NULL;
    }
    /* Reads up to the size fstat gave; a file that grew meanwhile is read as
     * it was, one that shrank as far as it goes. */
    size_t got;
    if (sneppx_read_up_to(fd, 0, text, expected, &got) != 0) {
        *status = sneppx_fail(SNEPPX_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        free(text);
        close(fd);
        return NULL;
    }
    close(fd);
    text[got] = '\0';
    *size = got;
    return text;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {"<tensor>": "<shard file>"}}. */
static sneppx_status scan_index(struct loader *loader, const char *index_path)
{
    sneppx_status status = SNEPPX_OK;
    size_t size = 0;
    char *text = read_small_file(index_path, &size, &status);
    if (!text)
        return status;
    const size_t bad_text = sneppx_json_bad_text(text, size);
    if (bad_text < size) {
        status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: byte %zu: " SNEPPX_JSON_BAD_TEXT
                             " (it would cut a tensor's name short)", index_path, bad_text);
        free(text);
        return status;
    }
    cJSON *root = cJSON_ParseWithLength(text, size);
    free(text);
    const cJSON *weight_map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(weight_map)) {
        cJSON_Delete(root);
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: not JSON with a \"weight_map\" object", index_path);
    }
    char *dir = parent_dir(index_path);
    if (!dir) {
        cJSON_Delete(root);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, weight_map) {
        if (sneppx_has_control(entry->string)) { /* every message about the tensor names it */
            status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: weight_map['%s']: a name with a control character",
                                 index_path, sneppx_clip(entry->string).text);
            break;
        }
        if (!layer_suffix(loader, entry->string))
            continue;
        /* The shard's path names it in every later message about its tensors, and the
         * index comes from a download: a control character there is refused, as in a
         * tensor's name above. */
        if (cJSON_IsString(entry) && sneppx_has_control(entry->valuestring)) {
            status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: weight_map['%s']: a shard name with a control character",
                                 index_path, entry->string);
            break;
        }
        if (!cJSON_IsString(entry) || !safe_shard_name(entry->valuestring)) {
            status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: weight_map['%s'] is not a file name inside %s",
                                 index_path, entry->string, dir);
            break;
        }
        char *shard_path = join_path(dir, entry->valuestring);
        int shard = shard_path ? shard_add(&loader->shards, shard_path) : -1;
        free(shard_path);
        if (shard < 0) {
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
            break;
        }
        if ((status = consider(loader, entry->string, shard)) != SNEPPX_OK)
            break;
    }
    free(dir);
    cJSON_Delete(root);
    return status;
}

/* Closes the shard unless one of the layer's tensors is in it: an open shard
 * holds a file descriptor, and a directory may have hundreds of shards. */
static void shard_close_if_unused(struct loader *loader, int shard)
{
    for (int i = 0; i < loader->candidate_count; i++)
        if (loader->candidates[i].shard == shard)
            return;
    sneppx_safetensors_close(loader->shards.files[shard]);
    loader->shards.files[shard] = NULL;
}

/* A .safetensors file: every tensor in it is a candidate. */
static sneppx_status scan_file(struct loader *loader, const char *file_path)
{
    int shard = shard_add(&loader->shards, file_path);
    if (shard < 0)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", file_path);
    sneppx_status status = shard_open(&loader->shards, shard);
    const sneppx_safetensors *file = loader->shards.files[shard];
    for (int64_t i = 0; status == SNEPPX_OK && i < sneppx_safetensors_tensor_count(file); i++) {
        sneppx_tensor_info info;
        status = sneppx_safetensors_tensor_info(file, i, &info);
        if (status == SNEPPX_OK)
            status = consider(loader, info.name, shard);
    }
    shard_close_if_unused(loader, shard);
    return status;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A directory without an index: every *.safetensors file in it, in name order. */
static sneppx_status scan_directory_shards(struct loader *loader, const char *dir_path)
{
    DIR *dir = opendir(dir_path);
    if (!dir)
        return sneppx_fail(SNEPPX_ERR_IO, "%s: cannot list: %s", dir_path, strerror(errno));
    char **names = NULL;
    int count = 0;
    sneppx_status status = SNEPPX_OK;
    for (struct dirent *item; (item = readdir(dir)) != NULL;) {
        if (!has_suffix(item->d_name, ".safetensors"))
            continue;
        char **grown = realloc(names, (size_t)(count + 1) * sizeof *names);
        if (!grown || !(grown[count] = join_path(dir_path, item->d_name))) {
            names = grown ? grown : names;
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", dir_path);
            break;
        }
        names = grown;
        count++;
    }
    closedir(dir);
    if (status == SNEPPX_OK && count == 0)
        status = sneppx_fail(SNEPPX_ERR_IO, "%s: no model.safetensors.index.json and no *.safetensors file",
                             dir_path);
    if (status == SNEPPX_OK)
        qsort(names, (size_t)count, sizeof *names, compare_strings);
    for (int i = 0; i < count; i++) {
        if (status == SNEPPX_OK && is_regular_file(names[i]))
            status = scan_file(loader, names[i]);
        free(names[i]);
    }
    free(names);
    return status;
}

static sneppx_status scan_checkpoint(struct loader *loader)
{
    struct stat st;
    if (stat(loader->path, &st) != 0)
        return sneppx_fail(SNEPPX_ERR_IO, "%s: %s", loader->path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return has_suffix(loader->path, ".json") ? scan_index(loader, loader->path)
                                                 : scan_file(loader, loader->path);
    char *index = join_path(loader->path, "model.safetensors.index.json");
    char *single = join_path(loader->path, "model.safetensors");
    sneppx_status status;
    /* model.safetensors before the index, as transformers' from_pretrained: a
     * sharded checkpoint saved again unsharded into its directory keeps the old
     * index (save_pretrained removes the stale shards but not it), and
     * transformers loads the new file. */
    if (!index || !single)
        status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", loader->path);
    else if (is_regular_file(single))
        status = scan_file(loader, single);
    else if (is_regular_file(index))
        status = scan_index(loader, index);
    else
        status = scan_directory_shards(loader, loader->path);
    free(index);
    free(single);
    return status;
}

static void format_shape(char *text, size_t size, int rank, const int64_t *shape)
{
    size_t used = (size_t)snprintf(text, size, "[");
    for (int d = 0; d < rank && used < size; d++)
        used += (size_t)snprintf(text + used, size - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < size)
        snprintf(text + used, size - used, "]");
}

/* Every spec found once, with the shape the config expects; returns the float
 * offsets of each tensor in one aligned buffer and the buffer's length. */
static sneppx_status check_found(struct loader *loader, int64_t offsets[], int64_t tensor_index[],
                                 int64_t *total_floats)
{
    /* The prefix of a tensor that is there names the missing one the way the checkpoint would. */
    const char *present = NULL;
    size_t prefix_len = 0;
    for (int i = 0; i < loader->spec_count && !present; i++)
        if (loader->found[i].name) {
            present = loader->found[i].name;
            prefix_len = strlen(present) - strlen(loader->specs[i].name);
        }
    if (!present)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: no tensor of layer %lld's self_attn (no name contains '%s')",
                           loader->path, (long long)loader->layer, loader->pattern);
    for (int i = 0; i < loader->spec_count; i++)
        if (!loader->found[i].name)
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: missing tensor '%.*s%s' (config '%s')", loader->path,
                               (int)prefix_len, present, loader->specs[i].name, loader->config->name);
    int64_t total = 0;
    for (int i = 0; i < loader->spec_count; i++) {
        const struct found_tensor *found = &loader->found[i];
        sneppx_status status = shard_open(&loader->shards, found->shard);
        if (status != SNEPPX_OK)
            return status;
        const sneppx_safetensors *file = loader->shards.files[found->shard];
        tensor_index[i] = sneppx_safetensors_find(file, found->name);
        if (tensor_index[i] < 0)
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: the index puts tensor '%s' in %s, which has no such tensor",
                               loader->path, found->name, loader->shards.paths[found->shard]);
        sneppx_tensor_info info;
        if ((status = sneppx_safetensors_tensor_info(file, tensor_index[i], &info)) != SNEPPX_OK)
            return status;
        const sneppx_attn_tensor *spec = &loader->specs[i];
        int same = info.rank == spec->rank;
        for (int d = 0; same && d < spec->rank; d++)
            same = info.shape[d] == spec->shape[d];
        if (!same) {
            char got[128], want[64];
            format_shape(got, sizeof got, info.rank, info.shape);
            format_shape(want, sizeof want, spec->rank, spec->shape);
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s' has shape %s, config '%s' expects %s",
                               loader->shards.paths[found->shard], found->name, got, loader->config->name, want);
        }
        offsets[i] = total;
        int64_t aligned = (info.element_count + TENSOR_ALIGN_FLOATS - 1) / TENSOR_ALIGN_FLOATS * TENSOR_ALIGN_FLOATS;
        if (__builtin_add_overflow(total, aligned, &total))
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: layer tensors overflow int64", loader->path);
    }
    *total_floats = total;
    return SNEPPX_OK;
}

static sneppx_status read_found(struct loader *loader, sneppx_attn_weights *weights)
{
    int64_t offsets[SNEPPX_ATTN_TENSORS_MAX], tensor_index[SNEPPX_ATTN_TENSORS_MAX], total = 0;
    sneppx_status status = check_found(loader, offsets, tensor_index, &total);
    if (status != SNEPPX_OK)
        return status;
    if ((uint64_t)total > SIZE_MAX / sizeof(float) ||
        posix_memalign((void **)&weights->storage, 64, (size_t)(total > 0 ? total : 1) * sizeof(float)) != 0)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld floats for layer %lld",
                           loader->path, (long long)total, (long long)loader->layer);
    for (int i = 0; i < loader->spec_count; i++) {
        const sneppx_attn_tensor *spec = &loader->specs[i];
        float *buffer = weights->storage + offsets[i];
        int64_t count = spec->shape[0] * (spec->rank == 2 ? spec->shape[1] : 1);
        status = sneppx_safetensors_read_f32(loader->shards.files[loader->found[i].shard], tensor_index[i],
                                             buffer, count);
        if (status != SNEPPX_OK)
            return status;
        memcpy((char *)&weights->view + spec->weights_offset, &buffer, sizeof buffer);
    }
    return SNEPPX_OK;
}

/* Checks the arguments and finds layer `layer`'s tensors (loader->found, their
 * shards in loader->shards); the caller frees the loader with loader_free. */
static sneppx_status locate(struct loader *loader, const char *call, const char *path, int64_t layer,
                            const sneppx_config *config)
{
    if (!path || !config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, path ? "config" : "path");
    /* Named here: open() would fail with a message that names an empty file. */
    if (!path[0])
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: path is empty (a checkpoint directory, its "
                           "model.safetensors.index.json or a .safetensors file)", call);
    if (layer < 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: layer %lld is negative", call, (long long)layer);
    loader->path = path;
    loader->config = config;
    loader->layer = layer;
    snprintf(loader->pattern, sizeof loader->pattern, "layers.%lld.self_attn.", (long long)layer);
    sneppx_status status = sneppx_attn_tensors(config, loader->specs, &loader->spec_count);
    if (status == SNEPPX_OK)
        status = scan_checkpoint(loader);
    if (status == SNEPPX_OK)
        status = choose_prefix(loader);
    return status;
}

static void loader_free(struct loader *loader)
{
    for (int i = 0; i < loader->spec_count; i++)
        free(loader->found[i].name);
    for (int i = 0; i < loader->candidate_count; i++)
        free(loader->candidates[i].name);
    shards_close(&loader->shards);
}

sneppx_status sneppx_attn_weights_load(const char *path, int64_t layer, const sneppx_config *config,
                                       sneppx_attn_weights **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_attn_weights_load: weights is NULL");
    *out = NULL;
    struct loader loader = {0};
    sneppx_status status = locate(&loader, "sneppx_attn_weights_load", path, layer, config);
    sneppx_attn_weights *weights = NULL;
    if (status == SNEPPX_OK) {
        weights = calloc(1, sizeof *weights);
        status = weights ? read_found(&loader, weights)
                         : sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    loader_free(&loader);
    if (status != SNEPPX_OK) {
        sneppx_attn_weights_free(weights);
        return status;
    }
    *out = weights;
    return SNEPPX_OK;
}

/* The checkpoint's tensors as sources, open until packed: each pack task reads
 * its rows. shard NULL: the whole layer; else the rank's shard (collective). */
static sneppx_status create_from_checkpoint(const char *call, const sneppx_config *config, const char *path,
                                            int64_t layer_index, const sneppx_shard *shard, sneppx_layer **out)
{
    struct loader loader = {0};
    sneppx_status status = locate(&loader, call, path, layer_index, config);
    int64_t offsets[SNEPPX_ATTN_TENSORS_MAX], tensor_index[SNEPPX_ATTN_TENSORS_MAX], total = 0;
    if (status == SNEPPX_OK)
        status = check_found(&loader, offsets, tensor_index, &total);
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    for (int i = 0; i < loader.spec_count && status == SNEPPX_OK; i++) {
        const sneppx_safetensors *file = loader.shards.files[loader.found[i].shard];
        struct sneppx_weight_source *source = &sources[loader.specs[i].weights_offset / sizeof(const float *)];
        source->kind = SNEPPX_SOURCE_FILE;
        source->file = file;
        source->index = tensor_index[i];
        status = sneppx_safetensors_check_f32(file, tensor_index[i]);
    }
    if (shard)
        status = sneppx_shard_create(config, status, sources, SNEPPX_SHARD_CHECKPOINT, layer_index, shard, out);
    else if (status == SNEPPX_OK)
        status = sneppx_layer_create_from_sources(config, sources, out);
    loader_free(&loader);
    return status;
}

sneppx_status sneppx_layer_create_from_safetensors(const sneppx_config *config, const char *path,
                                                   int64_t layer_index, sneppx_layer **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_layer_create_from_safetensors: layer is NULL");
    *out = NULL;
    return create_from_checkpoint("sneppx_layer_create_from_safetensors", config, path, layer_index, NULL, out);
}

sneppx_status sneppx_layer_create_shard_from_safetensors(const sneppx_config *config, const char *path,
                                                         int64_t layer_index, const sneppx_shard *shard,
                                                         sneppx_layer **out)
{
    sneppx_clear_error();
    if (out)
        *out = NULL;
    sneppx_status status = sneppx_shard_check_argument(shard);
    if (status != SNEPPX_OK)
        return status;
    return create_from_checkpoint("sneppx_layer_create_shard_from_safetensors", config, path, layer_index, shard,
                                  out);
}

const sneppx_weights *sneppx_attn_weights_view(const sneppx_attn_weights *weights)
{
    return weights ? &weights->view : NULL;
}

void sneppx_attn_weights_free(sneppx_attn_weights *weights)
{
    if (!weights)
        return;
    free(weights->storage);
    free(weights);
}
