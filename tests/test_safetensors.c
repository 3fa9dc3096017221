/* The safetensors file reader: dtype conversion to float32 (F32, F16, BF16,
 * F64 bit-exact), header validation (every malformed header is a FORMAT error
 * naming the file and the tensor), and argument checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "sneppx/safetensors.h"

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    sneppx_last_error());                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static char work_dir[256];

static const char *temp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", work_dir, name);
    return path;
}

/* 8-byte little-endian length (header_length, which may lie), header text, data. */
static void write_raw(const char *path, uint64_t header_length, const char *header, const void *data,
                      size_t data_size)
{
    FILE *stream = fopen(path, "wb");
    if (!stream) {
        perror(path);
        exit(2);
    }
    unsigned char length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (unsigned char)(header_length >> (8 * i));
    fwrite(length, 1, 8, stream);
    fwrite(header, 1, strlen(header), stream);
    if (data_size)
        fwrite(data, 1, data_size, stream);
    fclose(stream);
}

static void write_file(const char *path, const char *header, const void *data, size_t data_size)
{
    write_raw(path, strlen(header), header, data, data_size);
}

/* Opens a file whose header is `header` over 64 zero bytes; expects `expected`
 * and a message that contains `needle`. */
static void expect_open_error(const char *header, sneppx_status expected, const char *needle)
{
    static const unsigned char zeros[64];
    const char *path = temp_path("bad.safetensors");
    write_file(path, header, zeros, sizeof zeros);
    sneppx_safetensors *file = (sneppx_safetensors *)1;
    sneppx_status status = sneppx_safetensors_open(path, &file);
    CHECK(status == expected);
    CHECK(file == NULL);
    CHECK(strstr(sneppx_last_error(), path) != NULL);
    if (!strstr(sneppx_last_error(), needle)) {
        fprintf(stderr, "  header %s: message '%s' lacks '%s'\n", header, sneppx_last_error(), needle);
        failures++;
    }
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_dtype_conversion(void)
{
    /* F32 [2,2], F16 [7], BF16 [3], F64 [2], I32 [1], laid out back to back. */
    const float f32[4] = {1.5f, -2.25f, 3.0e-38f, 65536.0f};
    const uint16_t f16[7] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x7e00};
    const float f16_expect[6] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, -0.0f, INFINITY};
    const uint16_t bf16[3] = {0x3f80, 0xc0a0, 0x7f80};
    const float bf16_expect[3] = {1.0f, -5.0f, INFINITY};
    const double f64[2] = {0.1, -1.0e300};
    const int32_t i32[1] = {7};
    unsigned char data[16 + 14 + 6 + 16 + 4];
    size_t at = 0;
    memcpy(data + at, f32, 16), at += 16;
    memcpy(data + at, f16, 14), at += 14;
    memcpy(data + at, bf16, 6), at += 6;
    memcpy(data + at, f64, 16), at += 16;
    memcpy(data + at, i32, 4), at += 4;
    const char *header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[7],\"data_offsets\":[16,30]},"
        "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[30,36]},"
        "\"w.f64\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[36,52]},"
        "\"w.i32\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[52,56]}}   ";
    const char *path = temp_path("dtypes.safetensors");
    write_file(path, header, data, sizeof data);

    sneppx_safetensors *file = NULL;
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_OK);
    if (!file)
        return;
    CHECK(sneppx_safetensors_tensor_count(file) == 5);
    CHECK(strcmp(sneppx_safetensors_path(file), path) == 0);

    sneppx_tensor_info info;
    int64_t index = sneppx_safetensors_find(file, "w.f32");
    CHECK(sneppx_safetensors_tensor_info(file, index, &info) == SNEPPX_OK);
    CHECK(strcmp(info.name, "w.f32") == 0 && strcmp(info.dtype, "F32") == 0);
    CHECK(info.rank == 2 && info.shape[0] == 2 && info.shape[1] == 2);
    CHECK(info.element_count == 4 && info.byte_size == 16);
    float out[7];
    CHECK(sneppx_safetensors_read_f32(file, index, out, 4) == SNEPPX_OK);
    for (int i = 0; i < 4; i++)
        CHECK(same_bits(out[i], f32[i]));

    index = sneppx_safetensors_find(file, "w.f16");
    CHECK(sneppx_safetensors_read_f32(file, index, out, 7) == SNEPPX_OK);
    for (int i = 0; i < 6; i++)
        CHECK(same_bits(out[i], f16_expect[i]));
    CHECK(isnan(out[6]));

    index = sneppx_safetensors_find(file, "w.bf16");
    CHECK(sneppx_safetensors_read_f32(file, index, out, 3) == SNEPPX_OK);
    for (int i = 0; i < 3; i++)
        CHECK(same_bits(out[i], bf16_expect[i]));

    index = sneppx_safetensors_find(file, "w.f64");
    CHECK(sneppx_safetensors_read_f32(file, index, out, 2) == SNEPPX_OK);
    CHECK(same_bits(out[0], (float)0.1) && isinf(out[1]) && out[1] < 0);

    /* A rank-0 tensor has one element; I32 is valid in a file but does not convert. */
    index = sneppx_safetensors_find(file, "w.i32");
    CHECK(sneppx_safetensors_tensor_info(file, index, &info) == SNEPPX_OK);
    CHECK(info.rank == 0 && info.element_count == 1);
    CHECK(sneppx_safetensors_read_f32(file, index, out, 1) == SNEPPX_ERR_UNSUPPORTED);
    CHECK(strstr(sneppx_last_error(), "w.i32") && strstr(sneppx_last_error(), "I32"));

    /* Argument checks. */
    CHECK(sneppx_safetensors_find(file, "absent") == -1);
    CHECK(sneppx_safetensors_find(file, NULL) == -1);
    CHECK(sneppx_safetensors_read_f32(file, sneppx_safetensors_find(file, "w.f32"), out, 3) ==
          SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(sneppx_last_error(), "w.f32") != NULL);
    CHECK(sneppx_safetensors_read_f32(file, 99, out, 1) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_safetensors_read_f32(file, 0, NULL, 1) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_safetensors_tensor_info(file, -1, &info) == SNEPPX_ERR_INVALID_ARGUMENT);
    sneppx_safetensors_close(file);
}

static void test_malformed_headers(void)
{
    expect_open_error("[1, 2]", SNEPPX_ERR_FORMAT, "not a JSON object");
    expect_open_error("{\"a\": ", SNEPPX_ERR_FORMAT, "not a JSON object");
    expect_open_error("{} xx", SNEPPX_ERR_FORMAT, "trailing bytes");
    expect_open_error("{\"__metadata__\": 3}", SNEPPX_ERR_FORMAT, "__metadata__");
    expect_open_error("{\"t.w\": 5}", SNEPPX_ERR_FORMAT, "'t.w': entry is not a JSON object");
    expect_open_error("{\"t.w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", SNEPPX_ERR_FORMAT, "'t.w': missing");
    expect_open_error("{\"t.w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': unknown dtype 'F7'");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': \"shape\" is not an array");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': shape[0]");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': shape[0]");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
                      SNEPPX_ERR_FORMAT, "'t.w': shape product overflows");
    expect_open_error("{\"t.w\":{\"dtype\":\"F64\",\"shape\":[4503599627370496,1024],\"data_offsets\":[0,4]}}",
                      SNEPPX_ERR_FORMAT, "'t.w': byte size of the shape overflows");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': \"data_offsets\"");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': data_offsets [8, 4]");
    expect_open_error("{\"t.w\":{\"dtype\":\"F32\",\"shape\":[20],\"data_offsets\":[0,80]}}", SNEPPX_ERR_FORMAT,
                      "outside the 64-byte data buffer");
    expect_open_error("{\"t.w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", SNEPPX_ERR_FORMAT,
                      "'t.w': BF16 shape of 3 elements needs 6 bytes, data_offsets span 8");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      SNEPPX_ERR_FORMAT, "tensors 'a' and 'b' overlap");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      SNEPPX_ERR_FORMAT, "tensor 'a' appears twice");
    /* cJSON ends a name at the NUL an escape decodes to: "real\u0000.bak" (and the invalid
     * "real\u00zz") opened as a tensor 'real'. A raw NUL byte is refused too. */
    expect_open_error("{\"real\\u0000.bak\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      SNEPPX_ERR_FORMAT, "header byte 6: a NUL, a \\u escape");
    expect_open_error("{\"real\\u00zz\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      SNEPPX_ERR_FORMAT, "header byte 6: a NUL, a \\u escape");
    expect_open_error("{\"real\\u00", SNEPPX_ERR_FORMAT, "header byte 6");
    /* An empty tensor takes no bytes: the reference writer puts one of a wider dtype
     * ([1, 0] int64 position ids) at [0, 0], where the next tensor starts, and may name it
     * after that tensor, so sorting by offset alone saw 'a' [0, 8] before it. */
    const char *empty_first = temp_path("empty.safetensors");
    static const unsigned char data[8];
    write_file(empty_first, "{\"zz\":{\"dtype\":\"I64\",\"shape\":[1,0],\"data_offsets\":[0,0]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, sizeof data);
    sneppx_safetensors *empty = NULL;
    CHECK(sneppx_safetensors_open(empty_first, &empty) == SNEPPX_OK && empty != NULL);
    sneppx_safetensors_close(empty);
    unlink(empty_first);
    expect_open_error("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      SNEPPX_ERR_FORMAT, "tensors 'a' and 'e' overlap");

    static const unsigned char zeros[64];
    const char *path = temp_path("nul.safetensors");
    write_raw(path, 8, "{\"a\0\": 1}", zeros, sizeof zeros);
    sneppx_safetensors *file = NULL;
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_ERR_FORMAT && file == NULL);
    CHECK(strstr(sneppx_last_error(), "header byte 3: a NUL") != NULL);
    /* An escaped backslash before a u is no escape of u; other \u escapes are read. */
    write_file(path, "{\"a\\\\u0000\\u0041\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros,
               sizeof zeros);
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_OK && file != NULL);
    if (file) {
        sneppx_tensor_info info;
        CHECK(sneppx_safetensors_tensor_info(file, 0, &info) == SNEPPX_OK && strcmp(info.name, "a\\u0000A") == 0);
        sneppx_safetensors_close(file);
    }
}

static void test_header_length_bounds(void)
{
    const char *path = temp_path("short.safetensors");
    sneppx_safetensors *file = NULL;

    FILE *stream = fopen(path, "wb");
    fwrite("\x04\0\0\0", 1, 4, stream);
    fclose(stream);
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_ERR_FORMAT);
    CHECK(strstr(sneppx_last_error(), "too small") != NULL);

    write_raw(path, 1000, "{}", NULL, 0); /* claims more header than the file holds */
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_ERR_FORMAT);
    CHECK(strstr(sneppx_last_error(), "header length 1000") != NULL);

    write_raw(path, UINT64_MAX, "{}", NULL, 0);
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_ERR_FORMAT);

    write_raw(path, 0, "{}", NULL, 0);
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_ERR_FORMAT);

    write_file(path, "{}", NULL, 0); /* a valid file without tensors */
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_OK);
    CHECK(sneppx_safetensors_tensor_count(file) == 0);
    sneppx_safetensors_close(file);
    unlink(path);
}

/* A checkpoint truncated while open (being rewritten or synced): the reader
 * used to copy tensors out of a memory map, and a page past the new end of
 * the file raised SIGBUS. Now a read past it is an error naming the file and
 * the tensor, and what is still there reads as before. BF16 "b" spans more
 * than one conversion chunk (4 MiB). */
static void test_truncated_while_open(void)
{
    enum { A = 16384, B = (1 << 21) + 3, C = 16384 };
    char header[512];
    const size_t a_bytes = A * 4, b_bytes = (size_t)B * 2, c_bytes = C * 4;
    snprintf(header, sizeof header,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%zu]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}}",
             A, a_bytes, B, a_bytes, a_bytes + b_bytes, C, a_bytes + b_bytes, a_bytes + b_bytes + c_bytes);
    const size_t size = a_bytes + b_bytes + c_bytes;
    unsigned char *data = malloc(size);
    float *out = malloc((size_t)B * sizeof *out);
    if (!data || !out) {
        fprintf(stderr, "test_truncated_while_open: out of memory\n");
        failures++;
        free(data);
        free(out);
        return;
    }
    for (int i = 0; i < A; i++) {
        const float value = (float)i;
        memcpy(data + 4 * (size_t)i, &value, 4); /* little-endian host, as the tests assume */
    }
    for (int i = 0; i < B; i++) { /* bf16 0x3f80 + m is 1 + m / 128 for a 7-bit m */
        const uint16_t bits = (uint16_t)(0x3f80 + (i & 0x7f));
        memcpy(data + a_bytes + 2 * (size_t)i, &bits, 2);
    }
    memset(data + a_bytes + b_bytes, 0, c_bytes);
    const char *path = temp_path("truncated.safetensors");
    write_file(path, header, data, size);

    sneppx_safetensors *file = NULL;
    CHECK(sneppx_safetensors_open(path, &file) == SNEPPX_OK);
    if (file) {
        const int64_t b = sneppx_safetensors_find(file, "b");
        CHECK(sneppx_safetensors_read_f32(file, b, out, B) == SNEPPX_OK);
        int wrong = 0;
        for (int i = 0; i < B; i++)
            wrong += out[i] != 1.0f + (float)(i & 0x7f) / 128.0f;
        CHECK(wrong == 0);
        /* Cut the file 16 KiB into b: every later page of it is gone. */
        const off_t cut = (off_t)(8 + strlen(header) + a_bytes + 16384);
        CHECK(truncate(path, cut) == 0);
        CHECK(sneppx_safetensors_read_f32(file, b, out, B) == SNEPPX_ERR_IO);
        CHECK(strstr(sneppx_last_error(), path) != NULL);
        CHECK(strstr(sneppx_last_error(), "tensor 'b': the file ends at byte") != NULL);
        CHECK(strstr(sneppx_last_error(), "truncated") != NULL);
        CHECK(sneppx_safetensors_read_f32(file, sneppx_safetensors_find(file, "c"), out, C) == SNEPPX_ERR_IO);
        CHECK(strstr(sneppx_last_error(), "tensor 'c'") != NULL);
        /* What is still in the file reads as before. */
        CHECK(sneppx_safetensors_read_f32(file, sneppx_safetensors_find(file, "a"), out, A) == SNEPPX_OK);
        CHECK(out[0] == 0.0f && out[A - 1] == (float)(A - 1));
        sneppx_safetensors_close(file);
    }
    unlink(path);
    free(data);
    free(out);
}

/* A file that is not safetensors (here through a symlink, as a checkpoint
 * directory may hold): said so, without its first 8 bytes read as a number. */
static void test_not_safetensors(void)
{
    char text_path[512], link_path[512];
    snprintf(text_path, sizeof text_path, "%s", temp_path("passwd"));
    snprintf(link_path, sizeof link_path, "%s", temp_path("model.safetensors"));
    FILE *stream = fopen(text_path, "w");
    if (stream) {
        fputs("root:x:0:0:root:/root:/bin/bash\n", stream);
        fclose(stream);
    }
    CHECK(symlink(text_path, link_path) == 0);
    sneppx_safetensors *file = NULL;
    CHECK(sneppx_safetensors_open(link_path, &file) == SNEPPX_ERR_FORMAT);
    CHECK(strstr(sneppx_last_error(), link_path) != NULL);
    CHECK(strstr(sneppx_last_error(), "not a safetensors file") != NULL);
    CHECK(strstr(sneppx_last_error(), "3475222254926655346") == NULL); /* "root:x:0" as a length */
    unlink(link_path);
    unlink(text_path);
}

static void test_open_arguments(void)
{
    sneppx_safetensors *file = NULL;
    CHECK(sneppx_safetensors_open(temp_path("missing.safetensors"), &file) == SNEPPX_ERR_IO);
    CHECK(strstr(sneppx_last_error(), "missing.safetensors") != NULL);
    CHECK(sneppx_safetensors_open(work_dir, &file) == SNEPPX_ERR_IO); /* a directory */
    CHECK(sneppx_safetensors_open(NULL, &file) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_safetensors_open(work_dir, NULL) == SNEPPX_ERR_INVALID_ARGUMENT);
    CHECK(sneppx_safetensors_tensor_count(NULL) == 0);
    sneppx_safetensors_close(NULL);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(work_dir, sizeof work_dir, "%s/sneppx-safetensors-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(work_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_dtype_conversion();
    test_malformed_headers();
    test_header_length_bounds();
    test_truncated_while_open();
    test_not_safetensors();
    test_open_arguments();
    unlink(temp_path("dtypes.safetensors"));
    unlink(temp_path("bad.safetensors"));
    rmdir(work_dir);
    if (failures)
        fprintf(stderr, "test_safetensors: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
