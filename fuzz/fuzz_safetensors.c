/* Fuzzes the safetensors reader: the input is a whole file (8-byte header
 * length, JSON header, data), opened through a memfd's /proc path so no disk
 * is touched. Promises: a file that opens lists tensors sorted by name that
 * sneppx_safetensors_find() finds again, with byte sizes inside the file;
 * every F32/F16/BF16/F64 tensor converts (ASan checks every byte read stays
 * in the mapping); other dtypes are refused as unsupported. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "sneppx/safetensors.h"

static int memfd = -1;
static char memfd_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    memfd = memfd_create("sneppx-fuzz-safetensors", MFD_CLOEXEC);
    if (memfd < 0) {
        perror("memfd_create");
        exit(1);
    }
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    return 0;
}

static int converts(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0 ||
           strcmp(dtype, "F64") == 0;
}

static void check_file(const sneppx_safetensors *file, size_t file_size)
{
    const int64_t count = sneppx_safetensors_tensor_count(file);
    const char *previous = NULL;
    for (int64_t i = 0; i < count; i++) {
        sneppx_tensor_info info;
        FUZZ_ASSERT(sneppx_safetensors_tensor_info(file, i, &info) == SNEPPX_OK, "tensor %lld: %s", (long long)i,
                    sneppx_last_error());
        FUZZ_ASSERT(!previous || strcmp(previous, info.name) < 0, "tensors not sorted: '%s' then '%s'", previous,
                    info.name);
        previous = info.name;
        FUZZ_ASSERT(sneppx_safetensors_find(file, info.name) == i, "find('%s') is not %lld", info.name, (long long)i);
        FUZZ_ASSERT(info.byte_size <= file_size && info.element_count >= 0, "'%s': %llu bytes in a %zu-byte file",
                    info.name, (unsigned long long)info.byte_size, file_size);
        float *out = malloc(sizeof(float) * (size_t)(info.element_count ? info.element_count : 1));
        if (!out)
            continue;
        sneppx_status status = sneppx_safetensors_read_f32(file, i, out, info.element_count);
        FUZZ_ASSERT(converts(info.dtype) ? status == SNEPPX_OK : status == SNEPPX_ERR_UNSUPPORTED,
                    "'%s' (%s): %s", info.name, info.dtype, sneppx_last_error());
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FUZZ_ASSERT(ftruncate(memfd, 0) == 0 && pwrite(memfd, data, size, 0) == (ssize_t)size, "memfd write");
    sneppx_safetensors *file = NULL;
    sneppx_status status = sneppx_safetensors_open(memfd_path, &file);
    if (status == SNEPPX_OK)
        check_file(file, size);
    else
        FUZZ_ASSERT(!file && sneppx_last_error()[0] != '\0', "status %d without a message", (int)status);
    sneppx_safetensors_close(file);
    return 0;
}
