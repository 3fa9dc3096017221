/* A host's tuning record in the disk cache (runtime/tuning_record.h). */
#include "tuning_record.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk_cache.h"
#include "error.h"
#include "kernels.h"

#define RECORD_PREFIX "tuning-gemm-"
#define FAMILY "gemm"
#define MAX_PAYLOAD 64 /* "kc=<digits> mc=<digits>\n" */

void sneppx_gemm_tuning_key(const struct sneppx_target *target, char *key, size_t key_size)
{
    snprintf(key, key_size, RECORD_PREFIX "%s", target->name);
}

/* The target a record's key names, or NULL when key names no record. */
static const struct sneppx_target *record_target(const char *key)
{
    const size_t prefix = sizeof RECORD_PREFIX - 1;
    return key && strncmp(key, RECORD_PREFIX, prefix) == 0 ? sneppx_target_named(key + prefix) : NULL;
}

sneppx_status sneppx_tuning_fingerprint(const char *key, uint8_t fingerprint[SNEPPX_SHA256_SIZE])
{
    const struct sneppx_target *target = record_target(key);
    if (!target)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "'%s' is not " RECORD_PREFIX "<target>",
                           key ? sneppx_clip(key).text : "(null)");
    return sneppx_kernel_fingerprint_for(sneppx_kernel_family_find(FAMILY), target, key, fingerprint);
}

static int is_candidate(int64_t value, const int *candidates, int count)
{
    for (int i = 0; i < count; i++)
        if (candidates[i] == value)
            return 1;
    return 0;
}

sneppx_status sneppx_gemm_tuning_check(const struct sneppx_target *target, const struct sneppx_gemm_tuning *tuning,
                                       char *reason, size_t reason_size)
{
    if (!is_candidate(tuning->kc, target->gemm_kc_candidates, target->gemm_kc_candidate_count))
        snprintf(reason, reason_size, "kc %" PRId64 " is not among target %s's candidates", tuning->kc, target->name);
    else if (!is_candidate(tuning->mc, target->gemm_mc_candidates, target->gemm_mc_candidate_count))
        snprintf(reason, reason_size, "mc %" PRId64 " is not among target %s's candidates", tuning->mc, target->name);
    else
        return SNEPPX_OK;
    return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "tuning: %s", reason);
}

/* Parses exactly "kc=<digits> mc=<digits>\n" (no sign, no spaces, no leading
 * zero, at most 9 digits each); 0 on success. */
static int parse_payload(const char *text, size_t size, struct sneppx_gemm_tuning *tuning)
{
    const char *names[] = {"kc=", " mc="};
    int64_t values[2];
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        const size_t name_length = strlen(names[i]);
        if (size - at < name_length || memcmp(text + at, names[i], name_length) != 0)
            return -1;
        at += name_length;
        size_t digits = 0;
        int64_t value = 0;
        while (at < size && text[at] >= '0' && text[at] <= '9' && digits < 10) {
            value = value * 10 + (text[at++] - '0');
            digits++;
        }
        if (digits == 0 || digits > 9 || (digits > 1 && text[at - digits] == '0'))
            return -1;
        values[i] = value;
    }
    if (size - at != 1 || text[at] != '\n')
        return -1;
    tuning->kc = values[0];
    tuning->mc = values[1];
    return 0;
}

/* Reads, verifies and parses the record of target; mark_used: as a load (the
 * entry is dated for eviction), else as a listing's look. */
static sneppx_tuning_load read_record(const struct sneppx_target *target, int mark_used,
                                      struct sneppx_gemm_tuning *tuning, char *reason, size_t reason_size)
{
    char key[SNEPPX_KEY_MAX];
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    if (sneppx_tuning_fingerprint(key, fingerprint) != SNEPPX_OK) {
        snprintf(reason, reason_size, "%s", sneppx_last_error());
        return SNEPPX_TUNING_REFUSED;
    }
    void *payload = NULL;
    size_t size = 0;
    const sneppx_disk_load loaded =
        mark_used ? sneppx_disk_cache_load(key, fingerprint, &payload, &size, reason, reason_size)
                  : sneppx_disk_cache_verify(key, fingerprint, &payload, &size, reason, reason_size);
    if (loaded == SNEPPX_DISK_MISS)
        return SNEPPX_TUNING_NONE;
    if (loaded == SNEPPX_DISK_REJECTED)
        return SNEPPX_TUNING_REFUSED;
    struct sneppx_gemm_tuning parsed;
    const int bad = size > MAX_PAYLOAD || parse_payload(payload, size, &parsed) != 0;
    free(payload);
    if (bad) {
        snprintf(reason, reason_size, "its text is not kc=<k slice> mc=<block rows>");
        return SNEPPX_TUNING_REFUSED;
    }
    if (sneppx_gemm_tuning_check(target, &parsed, reason, reason_size) != SNEPPX_OK) {
        sneppx_clear_error();
        return SNEPPX_TUNING_REFUSED;
    }
    *tuning = parsed;
    return SNEPPX_TUNING_LOADED;
}

sneppx_tuning_load sneppx_gemm_tuning_load(const struct sneppx_target *target, struct sneppx_gemm_tuning *tuning,
                                           char *reason, size_t reason_size)
{
    return read_record(target, 1, tuning, reason, reason_size);
}

sneppx_tuning_load sneppx_tuning_record_verify(const char *key, char *reason, size_t reason_size)
{
    const struct sneppx_target *target = record_target(key);
    if (!target) {
        snprintf(reason, reason_size, "'%s' is not " RECORD_PREFIX "<target>", key ? sneppx_clip(key).text : "(null)");
        return SNEPPX_TUNING_REFUSED;
    }
    struct sneppx_gemm_tuning unused;
    return read_record(target, 0, &unused, reason, reason_size);
}

sneppx_status sneppx_gemm_tuning_store(const struct sneppx_target *target, const struct sneppx_gemm_tuning *tuning)
{
    char reason[128];
    sneppx_status status = sneppx_gemm_tuning_check(target, tuning, reason, sizeof reason);
    if (status != SNEPPX_OK)
        return status;
    char key[SNEPPX_KEY_MAX], text[MAX_PAYLOAD];
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    if ((status = sneppx_tuning_fingerprint(key, fingerprint)) != SNEPPX_OK)
        return status;
    if (!sneppx_disk_cache_path())
        return SNEPPX_OK;
    const int length = snprintf(text, sizeof text, "kc=%" PRId64 " mc=%" PRId64 "\n", tuning->kc, tuning->mc);
    int evicted = 0;
    return sneppx_disk_cache_store(key, fingerprint, text, (size_t)length, &evicted);
}
