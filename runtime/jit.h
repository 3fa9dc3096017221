/* Internal: the LLVM side of the runtime. Specializes the embedded bitcode of
 * a kernel family for one key, optimizes it for the host, emits its objects
 * (jit_codegen.h) as a bundle, and links bundles into the one process-wide
 * ORC LLJIT.
 * Knows nothing about caches: runtime/kernels.c decides what to compile,
 * load or reuse. */
#ifndef SNEPPX_RUNTIME_JIT_H
#define SNEPPX_RUNTIME_JIT_H
#include <stddef.h>
#include <stdint.h>
#include "kernel_registry.h"
#include "sneppx/status.h"
#include "sneppx_abi.h"

/* Everything besides the bitcode, key, host and the family's pass pipeline
 * (its jit_pipeline) that shapes the object code: the pipeline's tuning, the
 * code generation options. Part of the disk cache fingerprint. */
const char *sneppx_jit_options(void);

/* 0 when SNEPPX_JIT=0 forbids compiling (read once). */
int sneppx_jit_allowed(void);

typedef enum sneppx_jit_stage {
    SNEPPX_JIT_STAGE_SPECIALIZED,   /* spec_ globals constant, entries renamed, host attributes */
    SNEPPX_JIT_STAGE_OPTIMIZED      /* and the JIT's pass pipeline run for the host */
} sneppx_jit_stage;

/* The textual LLVM IR of the kernel key (values in the family's field order)
 * at stage, optimized by passes (LLVM's pipeline text), or by the family's
 * own pipeline when passes is NULL. *ir is malloc'd; the caller frees it.
 * Thread-safe. */
sneppx_status sneppx_jit_module_ir(const struct sneppx_kernel_family *family, const int64_t *values,
                                   const struct sneppx_target *target, sneppx_jit_stage stage, const char *passes,
                                   char **ir);

/* Specializes, optimizes and compiles the kernel key for the host to an
 * object bundle (object_bundle.h: the key's relocatable objects). threads is
 * how many threads its code generation may use (1 or 2, jit_codegen.h); 0
 * lets jit.c choose (take_codegen_threads). *object is malloc'd; the caller
 * frees it. Thread-safe (each compile has its own LLVM contexts and target
 * machines). */
sneppx_status sneppx_jit_compile_object(const struct sneppx_kernel_family *family, const int64_t *values,
                                        const struct sneppx_target *target, int threads, void **object,
                                        size_t *object_size);

/* Creates the process-wide LLJIT now if it does not exist yet (creation
 * errors are reported by the link that needs it). Thread-safe. */
void sneppx_jit_prepare(void);

/* Links the object bundle made by sneppx_jit_compile_object for key into
 * the process JIT (a bundle that does not parse is refused) and writes the
 * address of each entry of family to entry[] (unused slots NULL). The code
 * lives until process exit. *object_at_fault says whether a failure was the
 * bytes' (they do not unpack, load or link) rather than the process's (no JIT,
 * no memory). Thread-safe. */
sneppx_status sneppx_jit_link_object(const struct sneppx_kernel_family *family, const char *key,
                                     const void *object, size_t object_size,
                                     sneppx_kernel_fn entry[SNEPPX_ENTRY_COUNT], int *object_at_fault);

/* Tests only: removes every linked object from the JIT, so the same keys can
 * be linked again. Every entry address handed out before becomes invalid.
 * Not thread-safe. */
void sneppx_jit_unlink_all_for_testing(void);

#endif
