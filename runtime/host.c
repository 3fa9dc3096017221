/* The host CPU, read once from LLVM (runtime/host.h), and its target: a leaf
 * but for the target table the kernel registry table holds. */
#include "host.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <pthread.h>
#include <string.h>

#include "kernel_registry.h"

static sneppx_host host;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

/* features is LLVM's comma-separated "+name"/"-name" list. */
static int has_feature(const char *features, const char *feature)
{
    size_t length = strlen(feature);
    for (const char *at = features; (at = strstr(at, feature)) != NULL; at += length)
        if ((at == features || at[-1] == ',') && (at[length] == ',' || at[length] == '\0'))
            return 1;
    return 0;
}

/* The first target in the table whose every feature the host has; the last
 * requires none (gen/sneppx_gen/targets.py checks), so one always does. */
static const struct sneppx_target *host_target(const char *features)
{
    int i = 0;
    for (; i < sneppx_target_count - 1; i++) {
        const char *const *required = sneppx_targets[i].features;
        while (*required && has_feature(features, *required))
            required++;
        if (!*required)
            break;
    }
    return &sneppx_targets[i];
}

static void resolve_host(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    char *default_triple = LLVMGetDefaultTargetTriple();
    host.triple = LLVMNormalizeTargetTriple(default_triple);
    LLVMDisposeMessage(default_triple);
    host.cpu = LLVMGetHostCPUName();
    host.features = LLVMGetHostCPUFeatures();
    host.target = host_target(host.features);
}

const sneppx_host *sneppx_host_info(void)
{
    pthread_once(&host_once, resolve_host);
    return &host;
}

int sneppx_host_has_feature(const char *feature) { return has_feature(sneppx_host_info()->features, feature); }

const struct sneppx_target *sneppx_host_target(void) { return sneppx_host_info()->target; }
