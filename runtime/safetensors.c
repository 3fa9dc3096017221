/* One safetensors file: header parsed by cJSON, every entry validated before
 * anything is read, tensors read with pread and converted to float32 on
 * demand. Not memory-mapped: a checkpoint truncated while open (rewritten,
 * synced) would fault the copy out of the mapping with SIGBUS; pread returns
 * short instead, which is an error naming the file. Reads at offsets also
 * leave a part of a tensor (some rows) readable alone. */
#include "sneppx/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "half.h"
#include "json_text.h"
#include "regular_file.h"
#include "safetensors_internal.h"
#include "team.h"

/* The reference implementation (huggingface/safetensors) refuses larger headers. */
#define HEADER_MAX_BYTES 100000000ull
/* JSON numbers are doubles: integers above 2^53 cannot be represented exactly. */
#define JSON_EXACT_INT_MAX 9007199254740992.0
/* Dtypes other than F32 are read this many bytes at a time, then converted. */
#define CONVERT_CHUNK_BYTES ((size_t)4 << 20)

struct dtype_desc {
    const char *name;
    int element_size;
};

/* Every dtype of the safetensors spec with a whole-byte element size. */
static const struct dtype_desc known_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
};

struct tensor_entry {
    char *name;
    const char *dtype;        /* points into known_dtypes */
    int element_size;
    int rank;
    int64_t *shape;
    int64_t element_count;
    uint64_t begin, end;      /* byte range in the data buffer */
};

struct sneppx_safetensors {
    char *path;
    int fd;                    /* -1 when not open */
    uint64_t data_start;       /* file offset of the data buffer: 8 + header length */
    uint64_t data_size;
    int64_t count;
    struct tensor_entry *entries; /* sorted by name */
};

static const struct dtype_desc *find_dtype(const char *name)
{
    for (size_t i = 0; i < sizeof known_dtypes / sizeof known_dtypes[0]; i++)
        if (strcmp(known_dtypes[i].name, name) == 0)
            return &known_dtypes[i];
    return NULL;
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A JSON number that is a non-negative integer exactly representable. */
static int json_to_u64(const cJSON *item, uint64_t *value)
{
    if (!cJSON_IsNumber(item))
        return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d <= JSON_EXACT_INT_MAX) || (double)(uint64_t)d != d)
        return 0;
    *value = (uint64_t)d;
    return 1;
}

static void free_entries(struct tensor_entry *entries, int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        free(entries[i].name);
        free(entries[i].shape);
    }
    free(entries);
}

static sneppx_status parse_shape(const char *path, const char *name, const cJSON *shape,
                                 struct tensor_entry *entry)
{
    if (!cJSON_IsArray(shape))
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", path, name);
    int rank = cJSON_GetArraySize(shape);
    entry->rank = rank;
    entry->shape = calloc(rank > 0 ? (size_t)rank : 1, sizeof *entry->shape);
    if (!entry->shape)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", path);
    uint64_t count = 1;
    int dim = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, shape) {
        uint64_t extent;
        if (!json_to_u64(item, &extent) || extent > INT64_MAX)
            return sneppx_fail(SNEPPX_ERR_FORMAT,
                               "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, dim);
        if (__builtin_mul_overflow(count, extent, &count) || count > INT64_MAX)
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': shape product overflows", path, name);
        entry->shape[dim++] = (int64_t)extent;
    }
    entry->element_count = (int64_t)count;
    return SNEPPX_OK;
}

static sneppx_status parse_entry(const char *path, const cJSON *item, uint64_t data_size,
                                 struct tensor_entry *entry)
{
    const char *name = item->string;
    if (sneppx_has_control(name)) /* every message about the tensor names it */
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': a name with a control character", path,
                           sneppx_clip(name).text);
    if (!cJSON_IsObject(item))
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
    entry->name = strdup(name);
    if (!entry->name)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", path);

    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype))
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': missing string \"dtype\"", path, name);
    const struct dtype_desc *desc = find_dtype(dtype->valuestring);
    if (!desc)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name,
                           sneppx_clip(dtype->valuestring).text);
    entry->dtype = desc->name;
    entry->element_size = desc->element_size;

    sneppx_status status = parse_shape(path, name, cJSON_GetObjectItemCaseSensitive(item, "shape"), entry);
    if (status != SNEPPX_OK)
        return status;

    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_to_u64(cJSON_GetArrayItem(offsets, 0), &entry->begin) ||
        !json_to_u64(cJSON_GetArrayItem(offsets, 1), &entry->end))
        return sneppx_fail(SNEPPX_ERR_FORMAT,
                           "%s: tensor '%s': \"data_offsets\" must be two non-negative integers", path, name);
    if (entry->begin > entry->end || entry->end > data_size)
        return sneppx_fail(SNEPPX_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] lie outside the %llu-byte data buffer",
                           path, name, (unsigned long long)entry->begin, (unsigned long long)entry->end,
                           (unsigned long long)data_size);
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)entry->element_count, (uint64_t)entry->element_size, &bytes))
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s': byte size of the shape overflows", path, name);
    if (bytes != entry->end - entry->begin)
        return sneppx_fail(SNEPPX_ERR_FORMAT,
                           "%s: tensor '%s': %s shape of %lld elements needs %llu bytes, data_offsets span %llu",
                           path, name, entry->dtype, (long long)entry->element_count, (unsigned long long)bytes,
                           (unsigned long long)(entry->end - entry->begin));
    return SNEPPX_OK;
}

static int compare_by_name(const void *a, const void *b)
{
    return strcmp(((const struct tensor_entry *)a)->name, ((const struct tensor_entry *)b)->name);
}

static int compare_by_begin(const void *a, const void *b)
{
    const struct tensor_entry *x = *(const struct tensor_entry *const *)a;
    const struct tensor_entry *y = *(const struct tensor_entry *const *)b;
    /* At one offset an empty tensor first: the reference writer puts a zero-byte
     * tensor where the next one starts, and that is no overlap. */
    if (x->begin != y->begin)
        return (x->begin > y->begin) - (x->begin < y->begin);
    return (x->end > y->end) - (x->end < y->end);
}

/* Two tensors sharing bytes would alias each other's data: the file is corrupt. */
static sneppx_status check_no_overlap(const sneppx_safetensors *file)
{
    if (file->count < 2)
        return SNEPPX_OK;
    const struct tensor_entry **order = malloc((size_t)file->count * sizeof *order);
    if (!order)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", file->path);
    for (int64_t i = 0; i < file->count; i++)
        order[i] = &file->entries[i];
    qsort(order, (size_t)file->count, sizeof *order, compare_by_begin);
    sneppx_status status = SNEPPX_OK;
    for (int64_t i = 1; i < file->count && status == SNEPPX_OK; i++)
        if (order[i]->begin < order[i - 1]->end)
            status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data buffer",
                                 file->path, order[i - 1]->name, order[i]->name);
    free(order);
    return status;
}

static sneppx_status parse_header(sneppx_safetensors *file, const char *header, size_t header_size)
{
    const size_t bad_text = sneppx_json_bad_text(header, header_size);
    if (bad_text < header_size)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: header byte %zu: " SNEPPX_JSON_BAD_TEXT
                           " (it would cut a tensor's name short)", file->path, bad_text);
    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(header, header_size, &parse_end, 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: header is not a JSON object", file->path);
    }
    /* The format allows padding the header with spaces; anything else after the object is corruption. */
    for (const char *p = parse_end; p < header + header_size; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            cJSON_Delete(root);
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: trailing bytes after the JSON header", file->path);
        }

    int members = cJSON_GetArraySize(root);
    file->entries = calloc(members > 0 ? (size_t)members : 1, sizeof *file->entries);
    if (!file->entries) {
        cJSON_Delete(root);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory reading the header", file->path);
    }
    sneppx_status status = SNEPPX_OK;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item))
                status = sneppx_fail(SNEPPX_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", file->path);
        } else {
            /* Counted before parsing so that a half-filled entry is freed with the rest. */
            status = parse_entry(file->path, item, file->data_size, &file->entries[file->count++]);
        }
        if (status != SNEPPX_OK)
            break;
    }
    cJSON_Delete(root);
    if (status != SNEPPX_OK)
        return status;

    if (file->count > 1) /* a header of metadata only may leave entries NULL */
        qsort(file->entries, (size_t)file->count, sizeof *file->entries, compare_by_name);
    for (int64_t i = 1; i < file->count; i++)
        if (strcmp(file->entries[i - 1].name, file->entries[i].name) == 0)
            return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", file->path,
                               file->entries[i].name);
    return check_no_overlap(file);
}

static sneppx_status open_file(sneppx_safetensors *file, uint64_t *file_size)
{
    struct stat st;
    int not_regular;
    file->fd = sneppx_open_regular(file->path, &st, &not_regular);
    if (file->fd < 0)
        return not_regular ? sneppx_fail(SNEPPX_ERR_IO, "%s: not a regular file", file->path)
                           : sneppx_fail(SNEPPX_ERR_IO, "%s: cannot open: %s", file->path, strerror(errno));
    if (st.st_size < 8)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: %lld bytes, too small for the 8-byte header length",
                           file->path, (long long)st.st_size);
    *file_size = (uint64_t)st.st_size;
    return SNEPPX_OK;
}

/* Reads and parses the header; file->fd is open. */
static sneppx_status read_header(sneppx_safetensors *file, uint64_t file_size)
{
    unsigned char length_bytes[8];
    size_t got;
    if (sneppx_read_up_to(file->fd, 0, length_bytes, 8, &got) != 0)
        return sneppx_fail(SNEPPX_ERR_IO, "%s: cannot read: %s", file->path, strerror(errno));
    if (got < 8)
        return sneppx_fail(SNEPPX_ERR_IO, "%s: ended at byte %zu while its header was read (truncated?)",
                           file->path, got);
    const uint64_t header_size = load_le64(length_bytes);
    const uint64_t available = file_size - 8;
    /* Out of these bounds the first 8 bytes are no header length at all: the
     * file is something else, whose bytes the message should not show. */
    if (header_size < 2 || header_size > HEADER_MAX_BYTES)
        return sneppx_fail(SNEPPX_ERR_FORMAT,
                           "%s: not a safetensors file (its first 8 bytes are not a header length in [2, %llu])",
                           file->path, HEADER_MAX_BYTES);
    if (header_size > available)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "%s: header length %llu exceeds the %llu bytes after it (truncated?)",
                           file->path, (unsigned long long)header_size, (unsigned long long)available);
    char *header = malloc((size_t)header_size);
    if (!header)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory for its %llu-byte header", file->path,
                           (unsigned long long)header_size);
    sneppx_status status = SNEPPX_OK;
    if (sneppx_read_up_to(file->fd, 8, header, (size_t)header_size, &got) != 0)
        status = sneppx_fail(SNEPPX_ERR_IO, "%s: cannot read: %s", file->path, strerror(errno));
    else if (got < header_size)
        status = sneppx_fail(SNEPPX_ERR_IO, "%s: ended at byte %llu while its header was read (truncated?)",
                             file->path, (unsigned long long)(8 + got));
    if (status == SNEPPX_OK) {
        file->data_start = 8 + header_size;
        file->data_size = available - header_size;
        status = parse_header(file, header, (size_t)header_size);
    }
    free(header);
    return status;
}

sneppx_status sneppx_safetensors_open(const char *path, sneppx_safetensors **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_safetensors_open: file is NULL");
    *out = NULL;
    if (!path)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_safetensors_open: path is NULL");
    if (!path[0]) /* open() would fail with a message that names an empty file */
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_safetensors_open: path is empty");
    sneppx_safetensors *file = calloc(1, sizeof *file);
    if (!file || !(file->path = strdup(path))) {
        free(file);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    file->fd = -1;
    uint64_t file_size = 0;
    sneppx_status status = open_file(file, &file_size);
    if (status == SNEPPX_OK)
        status = read_header(file, file_size);
    if (status != SNEPPX_OK) {
        sneppx_safetensors_close(file);
        return status;
    }
    *out = file;
    return SNEPPX_OK;
}

int64_t sneppx_safetensors_tensor_count(const sneppx_safetensors *file)
{
    return file ? file->count : 0;
}

sneppx_status sneppx_safetensors_tensor_info(const sneppx_safetensors *file, int64_t index,
                                             sneppx_tensor_info *info)
{
    sneppx_clear_error();
    if (!file || !info)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_safetensors_tensor_info: %s is NULL",
                           file ? "info" : "file");
    if (index < 0 || index >= file->count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: tensor index %lld outside [0, %lld)", file->path,
                           (long long)index, (long long)file->count);
    const struct tensor_entry *entry = &file->entries[index];
    info->name = entry->name;
    info->dtype = entry->dtype;
    info->rank = entry->rank;
    info->shape = entry->shape;
    info->element_count = entry->element_count;
    info->byte_size = entry->end - entry->begin;
    return SNEPPX_OK;
}

int64_t sneppx_safetensors_find(const sneppx_safetensors *file, const char *name)
{
    if (!file || !name)
        return -1;
    int64_t low = 0, high = file->count;
    while (low < high) {
        int64_t mid = low + (high - low) / 2;
        int order = strcmp(file->entries[mid].name, name);
        if (order == 0)
            return mid;
        if (order < 0)
            low = mid + 1;
        else
            high = mid;
    }
    return -1;
}

static void convert_to_f32(const char *dtype, const unsigned char *src, int64_t count, float *dst)
{
    if (strcmp(dtype, "F32") == 0) { /* big-endian hosts: little-endian ones read F32 straight into dst */
        for (int64_t i = 0; i < count; i++) {
            uint32_t bits = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                            (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
            memcpy(&dst[i], &bits, sizeof bits);
        }
    } else if (strcmp(dtype, "F16") == 0) {
#pragma omp parallel for schedule(static) if (count > (1 << 20)) num_threads(sneppx_team_size(0))
        for (int64_t i = 0; i < count; i++)
            dst[i] = sneppx_f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else if (strcmp(dtype, "BF16") == 0) {
#pragma omp parallel for schedule(static) if (count > (1 << 20)) num_threads(sneppx_team_size(0))
        for (int64_t i = 0; i < count; i++)
            dst[i] = sneppx_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else { /* F64 */
        for (int64_t i = 0; i < count; i++) {
            uint64_t bits = load_le64(src + 8 * i);
            double value;
            memcpy(&value, &bits, sizeof value);
            dst[i] = (float)value;
        }
    }
}

/* Reads bytes [begin, begin + size) of the entry's data into out. The file
 * may have been truncated or rewritten since its header was read: ending
 * early is an error naming the file and the tensor. */
static sneppx_status read_entry_bytes(const sneppx_safetensors *file, const struct tensor_entry *entry,
                                      uint64_t begin, void *out, size_t size)
{
    const uint64_t offset = file->data_start + entry->begin + begin;
    size_t got;
    if (sneppx_read_up_to(file->fd, offset, out, size, &got) != 0)
        return sneppx_fail(SNEPPX_ERR_IO, "%s: tensor '%s': cannot read: %s", file->path, entry->name,
                           strerror(errno));
    if (got < size)
        return sneppx_fail(SNEPPX_ERR_IO,
                           "%s: tensor '%s': the file ends at byte %llu, before the tensor's end at byte %llu "
                           "(truncated since it was opened?)",
                           file->path, entry->name, (unsigned long long)(offset + got),
                           (unsigned long long)(file->data_start + entry->end));
    return SNEPPX_OK;
}

/* Elements [first, first + count) of the entry, converted to float32 into out. */
static sneppx_status read_f32_range(const sneppx_safetensors *file, const struct tensor_entry *entry,
                                    int64_t first, int64_t count, float *out)
{
    const uint64_t element_size = (uint64_t)entry->element_size;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (strcmp(entry->dtype, "F32") == 0) /* the file's bytes are the floats */
        return read_entry_bytes(file, entry, (uint64_t)first * element_size, out, (size_t)count * sizeof(float));
#endif
    const int64_t chunk = (int64_t)(CONVERT_CHUNK_BYTES / element_size);
    const size_t buffer_size = (size_t)(count < chunk ? count : chunk) * element_size;
    unsigned char *buffer = malloc(buffer_size > 0 ? buffer_size : 1);
    if (!buffer)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory", file->path, entry->name);
    sneppx_status status = SNEPPX_OK;
    for (int64_t done = 0; done < count && status == SNEPPX_OK; done += chunk) {
        const int64_t n = count - done < chunk ? count - done : chunk;
        status = read_entry_bytes(file, entry, (uint64_t)(first + done) * element_size, buffer,
                                  (size_t)n * element_size);
        if (status == SNEPPX_OK)
            convert_to_f32(entry->dtype, buffer, n, out + done);
    }
    free(buffer);
    return status;
}

sneppx_status sneppx_safetensors_check_f32(const sneppx_safetensors *file, int64_t index)
{
    const struct tensor_entry *entry = &file->entries[index];
    if (strcmp(entry->dtype, "F32") != 0 && strcmp(entry->dtype, "F16") != 0 &&
        strcmp(entry->dtype, "BF16") != 0 && strcmp(entry->dtype, "F64") != 0)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED,
                           "%s: tensor '%s': dtype %s does not convert to float32 (F32, F16, BF16, F64 do)",
                           file->path, entry->name, entry->dtype);
    return SNEPPX_OK;
}

sneppx_status sneppx_safetensors_read_f32_range(const sneppx_safetensors *file, int64_t index, int64_t first,
                                                int64_t count, float *out)
{
    return read_f32_range(file, &file->entries[index], first, count, out);
}

sneppx_status sneppx_safetensors_read_f32(const sneppx_safetensors *file, int64_t index, float *out,
                                          int64_t out_count)
{
    sneppx_clear_error();
    if (!file || !out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_safetensors_read_f32: %s is NULL",
                           file ? "out" : "file");
    if (index < 0 || index >= file->count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: tensor index %lld outside [0, %lld)", file->path,
                           (long long)index, (long long)file->count);
    const struct tensor_entry *entry = &file->entries[index];
    sneppx_status status = sneppx_safetensors_check_f32(file, index);
    if (status != SNEPPX_OK)
        return status;
    if (out_count != entry->element_count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "%s: tensor '%s' has %lld elements, out_count is %lld", file->path, entry->name,
                           (long long)entry->element_count, (long long)out_count);
    return read_f32_range(file, entry, 0, entry->element_count, out);
}

const char *sneppx_safetensors_path(const sneppx_safetensors *file)
{
    return file ? file->path : "";
}

void sneppx_safetensors_close(sneppx_safetensors *file)
{
    if (!file)
        return;
    if (file->fd >= 0)
        close(file->fd);
    free_entries(file->entries, file->count);
    free(file->path);
    free(file);
}
