/* Each kernel family names the LLVM pass pipeline the JIT runs on its keys
 * (its jit_pipeline, from gen/sneppx_gen/kernels.py):
 *  - every family's pipeline is text LLVM parses and runs (on an empty
 *    module), so a mistyped one fails here, not at a user's first compile;
 *  - the pipeline is part of a key's fingerprint: the runtime's fingerprint
 *    of a key is the one computed with its family's pipeline, and another
 *    pipeline gives another fingerprint, so a disk cache never hands out a
 *    kernel optimized otherwise;
 *  - a key of each family compiles with its pipeline (an object results);
 *  - a family whose pipeline is default<O2> pared to fewer passes
 *    (gen/sneppx_gen/jit_pipelines.py) gives its keys the IR default<O2>
 *    gives them (the JIT keeps no value names, so the IR is compared as the
 *    passes shape it), on every target this host runs (a child process per target
 *    narrower than the host's): keys other than those the pipeline was
 *    derived on, so a template or LLVM change that needs a left out pass
 *    fails here. */
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Keys of the families with a derived pipeline, values in field order. */
static const struct {
    const char *family;
    int64_t values[SNEPPX_MAX_KEY_FIELDS];
} derived_samples[] = {
    /* head_dim, v_head_dim, group, window, mask_mode (none, causal, mask) */
    {"attn_flash", {128, 128, 6, 0, 1}},
    {"attn_flash", {128, 128, 2, 1024, 2}},
    {"attn_flash", {576, 512, 8, 0, 2}},
    {"attn_flash", {80, 80, 3, 0, 0}},
    {"attn_flash", {256, 256, 12, 512, 1}},
    {"attn_sdpa", {128, 128, 6, 0, 1}},
    {"attn_sdpa", {112, 112, 2, 256, 2}},
    {"attn_sdpa", {576, 512, 128, 0, 1}},
    {"attn_sdpa", {160, 160, 5, 2048, 0}},
    {"attn_sdpa", {48, 48, 12, 0, 2}},
    /* head_dim, v_head_dim, group, window, mask_mode, kv_type (float32, bfloat16, float16, int8) */
    {"attn_decode", {96, 96, 2, 0, 1, 2}},
    {"attn_decode", {128, 128, 16, 0, 2, 3}},
    {"attn_decode", {64, 64, 8, 1024, 1, 1}},
    {"attn_decode", {256, 256, 5, 0, 2, 0}},
    {"attn_decode", {576, 512, 128, 0, 1, 1}},
    /* k, n, bias, weight_type (float32, bfloat16, float16, int8), kc, mc */
    {"gemm", {2048, 3072, 0, 3, 512, 112}},
    {"gemm", {5120, 1536, 1, 0, 512, 56}},
    {"gemm", {256, 96, 0, 1, 256, 24}},
    {"gemm", {3584, 3584, 1, 2, 512, 56}},
};

static void check_derived_pipelines(void)
{
    /* A pared pipeline no key here checks would go unchecked. */
    for (int f = 0; f < sneppx_kernel_family_count; f++) {
        const struct sneppx_kernel_family *family = &sneppx_kernel_families[f];
        if (strncmp(family->jit_pipeline, "default<", 8) == 0)
            continue;
        int samples = 0;
        for (size_t i = 0; i < sizeof derived_samples / sizeof derived_samples[0]; i++)
            samples += strcmp(derived_samples[i].family, family->family) == 0;
        CHECK(samples > 0, "%s's pipeline is pared (%s) but no key here checks it", family->family,
              family->jit_pipeline_summary);
    }
    for (size_t i = 0; i < sizeof derived_samples / sizeof derived_samples[0]; i++) {
        const struct sneppx_kernel_family *family = sneppx_kernel_family_find(derived_samples[i].family);
        CHECK(family != NULL, "no family %s", derived_samples[i].family);
        if (!family)
            continue;
        {
            const struct sneppx_target *target = sneppx_host_target();
            char key[SNEPPX_KEY_MAX];
            if (sneppx_kernel_key(family->family, derived_samples[i].values, target, key, sizeof key) != SNEPPX_OK) {
                CHECK(0, "sample %zu of %s: %s", i, family->family, sneppx_last_error());
                continue;
            }
            char *own = NULL, *o2 = NULL;
            const int built =
                sneppx_jit_module_ir(family, derived_samples[i].values, target, SNEPPX_JIT_STAGE_OPTIMIZED, NULL,
                                     &own) == SNEPPX_OK &&
                sneppx_jit_module_ir(family, derived_samples[i].values, target, SNEPPX_JIT_STAGE_OPTIMIZED,
                                     "default<O2>", &o2) == SNEPPX_OK;
            CHECK(built, "%s: %s", key, sneppx_last_error());
            if (built)
                CHECK(strcmp(own, o2) == 0,
                      "%s: its family's pipeline gives other IR than default<O2> (rerun "
                      "scripts/derive_jit_pipeline.py for %s)",
                      key, family->family);
            free(own);
            free(o2);
        }
    }
}

/* Runs this test for every other target the host can run, in a child
 * process (a process runs one target). */
static void check_other_targets(const char *self)
{
    for (int i = 0; i < sneppx_target_count; i++) {
        const struct sneppx_target *target = &sneppx_targets[i];
        if (target == sneppx_host_target() || sneppx_host_missing_feature(target))
            continue;
        pid_t child = fork();
        if (child == 0) {
            execl(self, self, "--target", target->name, (char *)NULL);
            _exit(127);
        }
        int status = -1;
        const int waited = child > 0 && waitpid(child, &status, 0) == child;
        CHECK(waited && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the checks at target %s failed (status %d)",
              target->name, status);
    }
}

int main(int argc, char **argv)
{
    const int child = argc == 3 && strcmp(argv[1], "--target") == 0;
    if (child) {
        const struct sneppx_target *target = sneppx_target_named(argv[2]);
        if (!target)
            return 2;
        sneppx_host_request_target(target, "--target");
    }
    check_pipelines_parse();
    check_fingerprints_and_compiles();
    check_derived_pipelines();
    if (!child)
        check_other_targets(argv[0]);
    return test_finish(&tally);
}
