/* Each kernel family names the LLVM pass pipeline the JIT runs on its keys
 * (its jit_pipeline, from gen/sneppx_gen/kernels.py):
 *  - every family's pipeline is text LLVM parses and runs (on an empty
 *    module), so a mistyped one fails here, not at a user's first compile;
 *  - the pipeline is part of a key's fingerprint: the runtime's fingerprint
 *    of a key is the one computed with its family's pipeline, and another
 *    pipeline gives another fingerprint, so a disk cache never hands out a
 *    kernel optimized otherwise;
 *  - a key of each family compiles with its pipeline (an object results). */
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "host.h"
#include "jit.h"
#include "kernel_registry.h"
#include "kernels.h"
#include "sneppx/status.h"
#include "test_util.h"

static test_tally tally;
#define CHECK(cond, ...) TEST_CHECK(&tally, cond, __VA_ARGS__)

static void check_pipelines_parse(void)
{
    LLVMInitializeNativeTarget();
    for (int i = 0; i < sneppx_kernel_family_count; i++) {
        const struct sneppx_kernel_family *family = &sneppx_kernel_families[i];
        CHECK(family->jit_pipeline && family->jit_pipeline[0], "%s has no pipeline", family->family);
        if (!family->jit_pipeline)
            continue;
        LLVMContextRef context = LLVMContextCreate();
        LLVMModuleRef module = LLVMModuleCreateWithNameInContext("empty", context);
        LLVMPassBuilderOptionsRef options = LLVMCreatePassBuilderOptions();
        LLVMErrorRef error = LLVMRunPasses(module, family->jit_pipeline, NULL, options);
        char *message = error ? LLVMGetErrorMessage(error) : NULL;
        CHECK(!error, "%s's pipeline '%s': %s", family->family, family->jit_pipeline, message ? message : "");
        if (message)
            LLVMDisposeErrorMessage(message);
        LLVMDisposePassBuilderOptions(options);
        LLVMDisposeModule(module);
        LLVMContextDispose(context);
    }
}

/* The smallest key of the family: each field at its minimum. */
static void smallest_key(const struct sneppx_kernel_family *family, int64_t *values, char *key, size_t key_size)
{
    for (int f = 0; f < family->field_count; f++)
        values[f] = family->field_min[f];
    if (sneppx_kernel_key(family->family, values, sneppx_host_target(), key, key_size) != SNEPPX_OK)
        key[0] = '\0';
}

static void check_fingerprints_and_compiles(void)
{
    const struct sneppx_target *target = sneppx_host_target();
    for (int i = 0; i < sneppx_kernel_family_count; i++) {
        const struct sneppx_kernel_family *family = &sneppx_kernel_families[i];
        const struct sneppx_embedded_bitcode *bitcode = sneppx_kernel_bitcode_find(family->family, target);
        if (!bitcode) /* gemm_bf16dot on a host without avx512_bf16 */
            continue;
        int64_t values[SNEPPX_MAX_KEY_FIELDS];
        char key[SNEPPX_KEY_MAX];
        smallest_key(family, values, key, sizeof key);
        CHECK(key[0], "no legal smallest key for %s: %s", family->family, sneppx_last_error());
        if (!key[0])
            continue;

        uint8_t runtime_print[SNEPPX_SHA256_SIZE], own[SNEPPX_SHA256_SIZE], other[SNEPPX_SHA256_SIZE];
        CHECK(sneppx_kernel_fingerprint(key, runtime_print) == SNEPPX_OK, "%s: %s", key, sneppx_last_error());
        sneppx_fingerprint_kernel(key, bitcode->sha256_hex, sneppx_host_info(), sneppx_jit_options(),
                                  family->jit_pipeline, own);
        const char *another = strcmp(family->jit_pipeline, "default<O2>") == 0 ? "default<O1>" : "default<O2>";
        sneppx_fingerprint_kernel(key, bitcode->sha256_hex, sneppx_host_info(), sneppx_jit_options(), another,
                                  other);
        CHECK(memcmp(runtime_print, own, sizeof own) == 0,
              "%s: the runtime's fingerprint is not the one with its family's pipeline %s", key,
              family->jit_pipeline);
        CHECK(memcmp(own, other, sizeof own) != 0, "%s: %s and %s give the same fingerprint", key,
              family->jit_pipeline, another);

        void *object = NULL;
        size_t object_size = 0;
        sneppx_status status = sneppx_jit_compile_object(family, values, target, 1, &object, &object_size);
        CHECK(status == SNEPPX_OK && object_size > 0, "%s with %s: %s", key, family->jit_pipeline,
              sneppx_last_error());
        free(object);
    }
}

int main(void)
{
    check_pipelines_parse();
    check_fingerprints_and_compiles();
    return test_finish(&tally);
}
