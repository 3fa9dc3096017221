#include "fingerprint.h"

#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jit.h"
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

/* Family and vector width of a key: `<family>-...-v<width>`. */
static int parse_key(const char *key, char *family, size_t family_size, int *vector_width)
{
    const char *dash = strchr(key, '-');
    const char *width = strrchr(key, '-');
    if (!dash || (size_t)(dash - key) >= family_size || width[1] != 'v')
        return 0;
    memcpy(family, key, (size_t)(dash - key));
    family[dash - key] = '\0';
    char *end;
    long value = strtol(width + 2, &end, 10);
    if (*end != '\0' || end == width + 2)
        return 0;
    *vector_width = (int)value;
    return 1;
}

sneppx_status sneppx_kernel_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE])
{
    char family[64];
    int vector_width = 0;
    if (!parse_key(key, family, sizeof family, &vector_width))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "key '%s' is not <family>-...-v<vector width>", key);
    const struct sneppx_embedded_bitcode *bitcode = sneppx_jit_bitcode(family, vector_width);
    if (!bitcode)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "kernel '%s': this build embeds no %s bitcode for vector width %d",
                           key, family, vector_width);
    const sneppx_jit_host *host = sneppx_jit_host_info();
    char abi_version[16];
    snprintf(abi_version, sizeof abi_version, "%d", SNEPPX_ABI_VERSION);

    const char *parts[] = {
        "sneppx kernel fingerprint 1",
        bitcode->sha256_hex, key,
        SNEPPX_VERSION, abi_version, SNEPPX_LLVM_VERSION, sneppx_jit_options(),
        host->triple, host->cpu, host->features,
    };
    struct sha256_ctx hash;
    sha256_init(&hash);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        add_part(&hash, parts[i]);
    sha256_digest(&hash, SNEPPX_SHA256_SIZE, fingerprint);
    return SNEPPX_OK;
}
