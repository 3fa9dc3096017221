/* Internal: SHA-256 and the identity of a compiled kernel.
 *
 * A disk cache entry is trusted only when its fingerprint equals the one
 * computed here, which covers everything that changes the machine code: the
 * bitcode (so the templates and the generator), the key, the sneppx, ABI and
 * LLVM versions, the optimization and code generation options, and the host
 * triple, CPU name and features. Never modification times. */
#ifndef SNEPPX_RUNTIME_FINGERPRINT_H
#define SNEPPX_RUNTIME_FINGERPRINT_H
#include <stddef.h>
#include <stdint.h>
#include "sneppx/status.h"

#define SNEPPX_SHA256_SIZE 32

/* digest = SHA-256(data). */
void sneppx_sha256(const void *data, size_t size, uint8_t digest[SNEPPX_SHA256_SIZE]);

/* The fingerprint of the kernel named by key: its family and vector width are
 * read from the key (`<family>-...-v<width>`), the bitcode hash from the
 * embedded table, the host from LLVM. SNEPPX_ERR_INVALID_ARGUMENT for a key
 * of another form, SNEPPX_ERR_UNSUPPORTED when the key names no embedded
 * bitcode. Thread-safe. */
sneppx_status sneppx_kernel_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE]);

#endif
