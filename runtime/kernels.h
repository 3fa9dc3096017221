/* Internal: kernel dispatch. key -> compiled entry points, through the
 * in-memory cache (lock-free read), the disk cache, then the LLVM JIT. */
#ifndef SNEPPX_RUNTIME_KERNELS_H
#define SNEPPX_RUNTIME_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include "sneppx/status.h"
#include "sneppx_abi.h"

#define SNEPPX_KEY_MAX 160

typedef struct sneppx_kernel {
    char key[SNEPPX_KEY_MAX];     /* canonical text, e.g. attn_flash-d128-dv128-g4-w0-causal-v16 */
    sneppx_kernel_fn entry[SNEPPX_ENTRY_COUNT]; /* by SNEPPX_ENTRY_*; NULL where the family has none */
} sneppx_kernel;

/* Formats the canonical key of family/values/vector width into key (SNEPPX_KEY_MAX). */
sneppx_status sneppx_kernel_key(const char *family, const int64_t *values, int vector_width,
                                char *key, size_t key_size);

/* Returns the kernel for the key, compiling it at most once per process (and
 * at most once per machine while the disk cache holds it). The returned
 * object lives until process exit. Thread-safe. */
sneppx_status sneppx_kernel_resolve(const char *family, const int64_t *values, int vector_width,
                                    const sneppx_kernel **kernel);

/* Sets up what every resolve needs once per process (the LLJIT that links
 * each kernel's object, ~3 ms), so that threads resolving keys side by side
 * do not queue behind its creation. Optional; thread-safe. */
void sneppx_kernel_prepare(void);

/* Tests only: forgets every resolved kernel (their code is unlinked: pointers
 * handed out before become invalid) and zeroes the JIT statistics, so the
 * next resolve goes to the disk cache or the JIT again. Not thread-safe. */
void sneppx_kernel_cache_reset_for_testing(void);

/* 16 on AVX-512 hosts, 8 otherwise (the host CPU's features as LLVM reports them). */
int sneppx_host_vector_width(void);

#endif
