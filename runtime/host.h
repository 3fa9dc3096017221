/* Internal: the host CPU as LLVM sees it and the target its kernels are
 * built for, a leaf module (LLVM and the kernel registry's target table). */
#ifndef SNEPPX_RUNTIME_HOST_H
#define SNEPPX_RUNTIME_HOST_H

struct sneppx_target;

/* Resolved once, lives until process exit. */
typedef struct sneppx_host {
    const char *triple;     /* normalized, "x86_64-pc-linux-gnu" */
    const char *cpu;        /* "znver4" */
    const char *features;   /* "+avx512f,+fma,...,-amx-tile" */
    const struct sneppx_target *target; /* the first of sneppx_targets whose features the host has */
} sneppx_host;

/* Runs target (the host's or a narrower one) as SNEPPX_TARGET=<its name> would,
 * whatever the environment says; requested_by names the asker in warnings
 * ("--target"). Only before the first sneppx_host_info, from one thread. */
void sneppx_host_request_target(const struct sneppx_target *target, const char *requested_by);

/* Thread-safe; initializes LLVM's native target on first use. */
const sneppx_host *sneppx_host_info(void);

/* 1 if the host has the LLVM feature ("+avx512bf16"), else 0. */
int sneppx_host_has_feature(const char *feature);

/* The first LLVM feature target needs that the host lacks, NULL when the host
 * runs target. */
const char *sneppx_host_missing_feature(const struct sneppx_target *target);

/* sneppx_host_info()->target: the target of the kernels this host runs. */
const struct sneppx_target *sneppx_host_target(void);

#endif
