/* Internal: SHA-256 and the identity of a compiled kernel.
 *
 * A disk cache entry is trusted only when its fingerprint equals the one
 * computed here, which covers everything that changes the machine code: the
 * bitcode (so the templates and the generator), the key, the sneppx, ABI and
 * LLVM versions, the optimization and code generation options, and the host
 * triple, CPU name and features. Never modification times. The caller passes
 * each of them in: this module knows hashing, not where the parts come from. */
#ifndef SNEPPX_RUNTIME_FINGERPRINT_H
#define SNEPPX_RUNTIME_FINGERPRINT_H
#include <stddef.h>
#include <stdint.h>
#include "host.h"

#define SNEPPX_SHA256_SIZE 32

/* digest = SHA-256(data). */
void sneppx_sha256(const void *data, size_t size, uint8_t digest[SNEPPX_SHA256_SIZE]);

/* The fingerprint of the kernel named by key, compiled from the bitcode whose
 * SHA-256 is bitcode_sha256_hex with the JIT's options and its family's pass
 * pipeline for host. */
void sneppx_fingerprint_kernel(const char *key, const char *bitcode_sha256_hex, const sneppx_host *host,
                               const char *jit_options, const char *jit_pipeline,
                               uint8_t fingerprint[SNEPPX_SHA256_SIZE]);

#endif
