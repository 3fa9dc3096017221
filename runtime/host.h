/* Internal: the host CPU as LLVM sees it, a leaf module (LLVM only). */
#ifndef SNEPPX_RUNTIME_HOST_H
#define SNEPPX_RUNTIME_HOST_H

/* Resolved once, lives until process exit. */
typedef struct sneppx_host {
    const char *triple;     /* normalized, "x86_64-pc-linux-gnu" */
    const char *cpu;        /* "znver4" */
    const char *features;   /* "+avx512f,+fma,...,-amx-tile" */
    int vector_width;       /* 16 with +avx512f, else 8 */
} sneppx_host;

/* Thread-safe; initializes LLVM's native target on first use. */
const sneppx_host *sneppx_host_info(void);

/* sneppx_host_info()->vector_width: the vector width of the kernels this host runs. */
int sneppx_host_vector_width(void);

#endif
