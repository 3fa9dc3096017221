/* Internal: kernel dispatch. key -> compiled entry points, through the
 * in-memory cache (lock-free read), the disk cache, then the LLVM JIT. */
#ifndef SNEPPX_RUNTIME_KERNELS_H
#define SNEPPX_RUNTIME_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include "fingerprint.h"
#include "host.h"
#include "kernel_registry.h"
#include "sneppx/status.h"
#include "sneppx_abi.h"

typedef struct sneppx_kernel {
    char key[SNEPPX_KEY_MAX];     /* canonical text, e.g. attn_flash-d128-dv128-g4-w0-causal-v16 */
    sneppx_kernel_fn entry[SNEPPX_ENTRY_COUNT]; /* by SNEPPX_ENTRY_*; NULL where the family has none */
} sneppx_kernel;

/* Returns the kernel for the key, compiling it at most once per process (and
 * at most once per machine while the disk cache holds it). The returned
 * object lives until process exit. Thread-safe. */
sneppx_status sneppx_kernel_resolve(const char *family, const int64_t *values, const struct sneppx_target *target,
                                    const sneppx_kernel **kernel);

/* The disk cache fingerprint this build and host give the kernel of key
 * (for tools that hold only a key, as read from the cache's index).
 * SNEPPX_ERR_INVALID_ARGUMENT for text that is no key, SNEPPX_ERR_UNSUPPORTED
 * when the build embeds no such bitcode. */
sneppx_status sneppx_kernel_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE]);

/* The same for an entry named key made from family's bitcode for target
 * (a kernel, or a tuning record, which borrows a family's bitcode): the one
 * place that gathers the parts sneppx_fingerprint_kernel hashes.
 * SNEPPX_ERR_UNSUPPORTED when the build embeds no such bitcode. */
sneppx_status sneppx_kernel_fingerprint_for(const struct sneppx_kernel_family *family,
                                            const struct sneppx_target *target, const char *key,
                                            uint8_t fingerprint[SNEPPX_SHA256_SIZE]);

/* Sets up what every resolve needs once per process (the LLJIT that links
 * each kernel's object, ~3 ms), so that threads resolving keys side by side
 * do not queue behind its creation. Optional; thread-safe. */
void sneppx_kernel_prepare(void);

/* Tests only: forgets every resolved kernel (their code is unlinked: pointers
 * handed out before become invalid) and zeroes the JIT statistics, so the
 * next resolve goes to the disk cache or the JIT again. Not thread-safe. */
void sneppx_kernel_cache_reset_for_testing(void);

#endif
