/* The host CPU, read once from LLVM (runtime/host.h). */
#include "host.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <pthread.h>
#include <string.h>

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

static void resolve_host(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    char *default_triple = LLVMGetDefaultTargetTriple();
    host.triple = LLVMNormalizeTargetTriple(default_triple);
    LLVMDisposeMessage(default_triple);
    host.cpu = LLVMGetHostCPUName();
    host.features = LLVMGetHostCPUFeatures();
    host.vector_width = has_feature(host.features, "+avx512f") ? 16 : 8;
}

const sneppx_host *sneppx_host_info(void)
{
    pthread_once(&host_once, resolve_host);
    return &host;
}

int sneppx_host_vector_width(void) { return sneppx_host_info()->vector_width; }
