/* Internal: code generation of a key's optimized module, on one thread or,
 * for a big module, on two at once. Knows nothing about keys' families or
 * caches: runtime/jit.c builds the module and links what this emits. */
#ifndef SNEPPX_RUNTIME_JIT_CODEGEN_H
#define SNEPPX_RUNTIME_JIT_CODEGEN_H
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <stddef.h>
#include "sneppx/status.h"

/* An LLVM context's first error diagnostic, kept (LLVM's default handler
 * prints it and exits the process). */
struct sneppx_jit_diagnostics {
    char message[256]; /* "" while there is none */
};

/* Keeps context's error diagnostics in *kept from now on; kept must outlive
 * the context's use. */
void sneppx_jit_keep_diagnostics(LLVMContextRef context, struct sneppx_jit_diagnostics *kept);

/* A new target machine for the host (aggressive codegen, PIC, small code
 * model), or NULL with why in error. Thread-safe. */
LLVMTargetMachineRef sneppx_jit_host_machine(char *error, size_t error_size);

/* Emits the object code of module (optimized, named for its key) as an
 * object bundle (object_bundle.h), *bundle malloc'd. With threads >= 2 a
 * module with enough code, whose functions are used across parts only by
 * direct calls, is split in two by function: this thread emits one part
 * while another emits the other. A function one part calls in the other is
 * made protected, so the call stays direct, and if internal renamed
 * symbol_prefix + "__" + its name (the key's prefix keeps keys apart in the
 * one JIT).
 * Every part, a whole module's too, is emitted from the module's bitcode
 * read back in a context of its own, so that a function's code does not
 * depend on the split. The module is changed either way (the caller still
 * disposes it); machine serves this thread's part. */
sneppx_status sneppx_jit_emit_bundle(LLVMModuleRef module, LLVMTargetMachineRef machine, const char *key,
                                     const char *symbol_prefix, int threads, void **bundle, size_t *bundle_size);

#endif
