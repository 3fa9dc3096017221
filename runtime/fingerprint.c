#include "fingerprint.h"

#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sneppx_abi.h"

void sneppx_sha256(const void *data, size_t size, uint8_t digest[SNEPPX_SHA256_SIZE])
{
    struct sha256_ctx hash;
    sha256_init(&hash);
    sha256_update(&hash, size, data);
    sha256_digest(&hash, SNEPPX_SHA256_SIZE, digest);
}

/* Each part is hashed with its length first, so no two different lists of
 * parts hash the same bytes ("ab","c" vs "a","bc"). */
static void add_part(struct sha256_ctx *hash, const char *part)
{
    uint64_t length = strlen(part);
    sha256_update(hash, sizeof length, (const uint8_t *)&length);
    sha256_update(hash, length, (const uint8_t *)part);
}

void sneppx_fingerprint_kernel(const char *key, const char *bitcode_sha256_hex, const sneppx_host *host,
                               const char *jit_options, const char *jit_pipeline,
                               uint8_t fingerprint[SNEPPX_SHA256_SIZE])
{
    char abi_version[16];
    snprintf(abi_version, sizeof abi_version, "%d", SNEPPX_ABI_VERSION);
    const char *parts[] = {
        "sneppx kernel fingerprint 1",
        bitcode_sha256_hex, key,
        SNEPPX_VERSION, abi_version, SNEPPX_LLVM_VERSION, jit_options, jit_pipeline,
        host->triple, host->cpu, host->features,
    };
    struct sha256_ctx hash;
    sha256_init(&hash);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        add_part(&hash, parts[i]);
    sha256_digest(&hash, SNEPPX_SHA256_SIZE, fingerprint);
}
