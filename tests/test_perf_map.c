/* SNEPPX_PERF_MAP=1: every kernel linked into the JIT (compiled or loaded
 * from the disk cache) names its functions in /tmp/perf-<pid>.map, at the
 * addresses the kernel's entries were linked to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "test_util.h"

/* The size of the map line starting at address whose name begins with name_prefix; 0 if none. */
static unsigned long long mapped_size(const char *path, uintptr_t address, const char *name_prefix)
{
    FILE *map = fopen(path, "r");
    char line[512];
    unsigned long long found = 0;
    while (map && !found && fgets(line, sizeof line, map)) {
        unsigned long long start = 0, size = 0;
        int name_at = 0;
        if (sscanf(line, "%llx %llx %n", &start, &size, &name_at) == 2 && name_at > 0 && start == address &&
            strncmp(line + name_at, name_prefix, strlen(name_prefix)) == 0)
            found = size;
    }
    if (map)
        fclose(map);
    return found;
}

int main(void)
{
    test_tally tally = {0};
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
    unlink(path);
    setenv("SNEPPX_PERF_MAP", "1", 1);
    const int64_t gemm_values[] = {64, 96, 0};
    const int vector_width = sneppx_host_vector_width();
    const sneppx_kernel *gemm;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", gemm_values, vector_width, &gemm) == SNEPPX_OK,
                    "resolve: %s", sneppx_last_error()))
        return test_finish(&tally);
    char name[256];
    snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_v%d [%s]", vector_width, gemm->key);
    unsigned long long size = mapped_size(path, (uintptr_t)gemm->entry[SNEPPX_ENTRY_RUN], name);
    TEST_CHECK(&tally, size > 64 && size < (1 << 20), "%s: the entry '%s' at %p, size %llu", path, name,
               (void *)(uintptr_t)gemm->entry[SNEPPX_ENTRY_RUN], size);
    snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_v%d_pack [%s]", vector_width, gemm->key);
    size = mapped_size(path, (uintptr_t)gemm->entry[SNEPPX_ENTRY_PACK], name);
    TEST_CHECK(&tally, size > 0, "%s: the pack entry '%s' at %p", path, name,
               (void *)(uintptr_t)gemm->entry[SNEPPX_ENTRY_PACK]);

    /* The same key linked again from the disk cache is named at its new address. */
    sneppx_kernel_cache_reset_for_testing();
    const sneppx_kernel *again;
    if (TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", gemm_values, vector_width, &again) == SNEPPX_OK,
                   "resolve again: %s", sneppx_last_error())) {
        snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_v%d [%s]", vector_width, again->key);
        TEST_CHECK(&tally, mapped_size(path, (uintptr_t)again->entry[SNEPPX_ENTRY_RUN], name) > 0,
                   "%s: '%s' at %p after a reload", path, name, (void *)(uintptr_t)again->entry[SNEPPX_ENTRY_RUN]);
    }
    unlink(path);
    return test_finish(&tally);
}
