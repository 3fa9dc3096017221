#include "fingerprint.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "jit.h"
#include "sneppx_abi.h"

void sneppx_sha256(const void *data, size_t size, uint8_t digest[SNEPPX_SHA256_SIZE])
{
    unsigned int digest_size = SNEPPX_SHA256_SIZE;
    EVP_Digest(data, size, digest, &digest_size, EVP_sha256(), NULL);
}

void sneppx_sha256_hex(const uint8_t digest[SNEPPX_SHA256_SIZE], char hex[SNEPPX_SHA256_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SNEPPX_SHA256_SIZE; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[2 * SNEPPX_SHA256_SIZE] = '\0';
}

/* Each part is hashed with its length first, so no two different lists of
 * parts hash the same bytes ("ab","c" vs "a","bc"). */
static void add_part(EVP_MD_CTX *hash, const char *part)
{
    uint64_t length = strlen(part);
    EVP_DigestUpdate(hash, &length, sizeof length);
    EVP_DigestUpdate(hash, part, length);
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
    EVP_MD_CTX *hash = EVP_MD_CTX_new();
    if (!hash)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory hashing kernel '%s'", key);
    EVP_DigestInit_ex(hash, EVP_sha256(), NULL);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        add_part(hash, parts[i]);
    unsigned int size = SNEPPX_SHA256_SIZE;
    EVP_DigestFinal_ex(hash, fingerprint, &size);
    EVP_MD_CTX_free(hash);
    return SNEPPX_OK;
}
