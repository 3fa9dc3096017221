/* The host's read bandwidth, measured one way for every tool that rates work
 * against it (sneppx-run's decode roofline, sneppx-bench's peak, decode and
 * generate stages): threads streaming their own share of a buffer far larger
 * than the caches, on huge pages, with the widest vectors the host has. The
 * host is shared and noisy, so a probe is meant to run beside what it rates. */
#ifndef SNEPPX_TOOLS_READ_PROBE_H
#define SNEPPX_TOOLS_READ_PROBE_H
#include <stddef.h>
#include <stdint.h>

typedef struct read_probe {
    float *buffer;
    int64_t floats;
    int wide; /* 16-float vectors (AVX-512), else 8 */
} read_probe;

/* 1 when the host runs 16-float vectors (AVX-512F), the width the probe and the
 * bench's FMA peak use; else 0 (8-float AVX2 vectors). */
int read_probe_host_is_wide(void);

/* A buffer of `bytes` (rounded to huge pages), touched before any timing. 0 on success. */
int read_probe_init(read_probe *probe, size_t bytes);
void read_probe_free(read_probe *probe);

/* Bytes one pass of `threads` threads reads (each thread's share rounded down). */
double read_probe_pass_bytes(const read_probe *probe, int threads);

/* One pass; returns a sum of what was read, so that nothing is dead. */
float read_probe_pass(const read_probe *probe, int threads);

/* The best of `runs` passes, in GB/s. */
double read_probe_best_gbs(const read_probe *probe, int threads, int runs);

#endif
