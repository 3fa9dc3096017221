/* Internal: code generation of a key's optimized module, on one thread or,
 * for a big module, on two at once. Knows nothing about keys' families or
 * caches: runtime/jit.c builds the module and links what this emits. */
#ifndef SNEPPX_RUNTIME_JIT_CODEGEN_H
#define SNEPPX_RUNTIME_JIT_CODEGEN_H
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <stddef.h>
#include "sneppx/status.h"

/* A new target machine for the host (aggressive codegen, PIC, small code
 * model), or NULL with why in error. Thread-safe. */
LLVMTargetMachineRef sneppx_jit_host_machine(char *error, size_t error_size);

/* Emits the object code of module (optimized, named for its key) as an
 * object bundle (object_bundle.h), *bundle malloc'd. With threads >= 2 a
 * module with enough code is split in two by function: this thread emits
 * one part while another emits the other. A function one part calls in the
 * other is renamed symbol_prefix + "__" + its name (the key's prefix keeps
 * keys apart in the one JIT) and made protected, so calls stay direct.
 * Every part, a whole module's too, is emitted from the module's bitcode
 * read back in a context of its own, so that a function's code does not
 * depend on the split. The module is changed either way (the caller still
 * disposes it); machine serves this thread's part. */
sneppx_status sneppx_jit_emit_bundle(LLVMModuleRef module, LLVMTargetMachineRef machine, const char *key,
                                     const char *symbol_prefix, int threads, void **bundle, size_t *bundle_size);

#endif
