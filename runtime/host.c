/* The host CPU, read once from LLVM (runtime/host.h), and its target: a leaf
 * but for the target table the kernel registry table holds (and logging). */
#include "host.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernel_registry.h"

static sneppx_host host;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
/* The target to run instead of the host's, and who asked: sneppx_host_request_target,
 * else $SNEPPX_TARGET. */
static const char *requested_name;
static const char *requested_by = "SNEPPX_TARGET";

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

/* The feature families of vectors wider than 8 floats: a host narrowed to an
 * 8-wide target turns each off, so that LLVM emits no EVEX encoding and no
 * register above ymm15, as on an AVX2 host. */
static int wider_than_8_floats(const char *feature)
{
    static const char *const families[] = {"avx512", "avx10", "evex512", "amx-"};
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (strncmp(feature, families[i], strlen(families[i])) == 0)
            return 1;
    return 0;
}

/* SNEPPX_TARGET=<name> (or sneppx_host_request_target): run another target the
 * host can run, e.g. v8 (AVX2) on an AVX-512 host, to measure it there. A target narrower than the host's gets
 * the host's features without the wider ones (the same CPU, as if it had
 * AVX2 only); the disk cache's fingerprint covers the features, so its kernels
 * never mix with the host's own. An unknown name, or a target the host cannot
 * run, is ignored with a warning naming who asked for it. */
static void apply_target_override(void)
{
    const char *name = requested_name ? requested_name : getenv("SNEPPX_TARGET");
    if (!name || !*name || strcmp(name, host.target->name) == 0)
        return;
    const struct sneppx_target *chosen = sneppx_target_named(name);
    if (!chosen || chosen < host.target) {
        sneppx_log(0, "warning: %s: '%s' is %s; running %s", requested_by, sneppx_clip(name).text,
                   chosen ? "wider than this host can run" : "not a target of this build", host.target->name);
        return;
    }
    if (chosen->vector_width > 8) { /* another AVX-512 target: the host's features are its superset */
        host.target = chosen;
        return;
    }
    const size_t size = strlen(host.features) + 1;
    char *narrowed = malloc(size);
    if (!narrowed) {
        sneppx_log(0, "warning: %s: no memory to narrow the host's features; running %s", requested_by,
                   host.target->name);
        return;
    }
    memcpy(narrowed, host.features, size);
    for (char *at = narrowed; at; at = strchr(at, ','), at = at ? at + 1 : NULL)
        if (at[0] == '+' && wider_than_8_floats(at + 1))
            at[0] = '-';
    LLVMDisposeMessage((char *)host.features);
    host.features = narrowed;
    host.target = chosen;
    sneppx_log(1, "%s: running %s, host features narrowed to it", requested_by, chosen->name);
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
    apply_target_override();
}

void sneppx_host_request_target(const struct sneppx_target *target, const char *requested_by_whom)
{
    requested_name = target->name;
    requested_by = requested_by_whom;
}

const sneppx_host *sneppx_host_info(void)
{
    pthread_once(&host_once, resolve_host);
    return &host;
}

int sneppx_host_has_feature(const char *feature) { return has_feature(sneppx_host_info()->features, feature); }

const char *sneppx_host_missing_feature(const struct sneppx_target *target)
{
    for (const char *const *feature = target->features; *feature; feature++)
        if (!sneppx_host_has_feature(*feature))
            return *feature;
    return NULL;
}

const struct sneppx_target *sneppx_host_target(void) { return sneppx_host_info()->target; }
