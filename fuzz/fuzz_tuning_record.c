/* Fuzzes the GEMM tuning record's text: the input's first byte picks a target
 * (sneppx_targets), the rest becomes the payload of its record
 * tuning-gemm-<target>, stored by the disk cache itself with this host's
 * fingerprint, so the payload reaches the record's parser as the cache hands
 * it over after its own checks; sneppx_gemm_tuning_load() judges it.
 * Promises: the record is loaded or refused (never missing), a refusal says
 * why; it is loaded exactly when the payload is "kc=<k> mc=<m>\n" with k and m
 * among the target's candidates, written as the store writes them (so only
 * such values, and no other spelling, reach a GEMM key), with those values;
 * a loaded record passes the check, stores back to the same bytes, loads
 * again to the same values, and gives sneppx_gemm_tiles() its kc and mc for
 * float32 and 16-bit panels (int8 keeps the target's). ASan and UBSan watch
 * the parser's reads. The cache directory is a private one under /dev/shm
 * (or $TMPDIR), made at startup. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "disk_cache.h"
#include "error.h"
#include "fuzz.h"
#include "gemm_tiles.h"
#include "kernel_registry.h"
#include "tuning_record.h"

/* The private directory goes when the fuzzer exits. */
static void remove_cache(void)
{
    sneppx_disk_cache_clear();
    rmdir(sneppx_disk_cache_path());
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[PATH_MAX];
    /* No tuning at first use: a refused record leaves the defaults. */
    if (fuzz_private_dir("sneppx-fuzz-tuning", dir, sizeof dir) != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0 || unsetenv("SNEPPX_TUNE") != 0 ||
        !sneppx_disk_cache_path()) {
        fprintf(stderr, "fuzz_tuning_record: no private cache directory at %s\n", dir);
        exit(1);
    }
    atexit(remove_cache);
    return 0;
}

/* The one payload each candidate pair has: the store's spelling. */
static int canonical(const struct sneppx_target *target, const uint8_t *payload, size_t size,
                     struct sneppx_gemm_tuning *tuning)
{
    for (int i = 0; i < target->gemm_kc_candidate_count; i++)
        for (int j = 0; j < target->gemm_mc_candidate_count; j++) {
            char text[64];
            const int n = snprintf(text, sizeof text, "kc=%d mc=%d\n", target->gemm_kc_candidates[i],
                                   target->gemm_mc_candidates[j]);
            if ((size_t)n == size && memcmp(text, payload, size) == 0) {
                tuning->kc = target->gemm_kc_candidates[i];
                tuning->mc = target->gemm_mc_candidates[j];
                return 1;
            }
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const struct sneppx_target *target = &sneppx_targets[data[0] % sneppx_target_count];
    const uint8_t *payload = data + 1;
    const size_t payload_size = size - 1;
    char key[SNEPPX_KEY_MAX];
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    sneppx_gemm_tuning_key(target, key, sizeof key);
    if (sneppx_tuning_fingerprint(key, fingerprint) != SNEPPX_OK)
        return 0; /* no GEMM bitcode for this target in this build: it has no record */
    int evicted = 0;
    sneppx_status status = sneppx_disk_cache_store(key, fingerprint, payload, payload_size, &evicted);
    FUZZ_ASSERT(status == SNEPPX_OK, "the disk cache cannot store %zu bytes as %s: %s", payload_size, key,
                sneppx_last_error());

    struct sneppx_gemm_tuning tuning = {-1, -1}, want = {-1, -1};
    char reason[256] = "";
    const sneppx_tuning_load loaded = sneppx_gemm_tuning_load(target, &tuning, reason, sizeof reason);
    const int accept = canonical(target, payload, payload_size, &want);
    FUZZ_ASSERT(loaded != SNEPPX_TUNING_NONE, "a stored record of %zu bytes is missing", payload_size);
    FUZZ_ASSERT((loaded == SNEPPX_TUNING_LOADED) == accept, "%s the %zu-byte payload '%.*s' (target %s)%s%s",
                accept ? "refused" : "loaded", payload_size, (int)(payload_size < 64 ? payload_size : 64),
                (const char *)payload, target->name, accept ? ": " : "", accept ? reason : "");
    if (loaded == SNEPPX_TUNING_REFUSED) {
        FUZZ_ASSERT(reason[0] != '\0', "a refusal without a reason");
        return 0;
    }
    FUZZ_ASSERT(tuning.kc == want.kc && tuning.mc == want.mc, "loaded kc %" PRId64 " mc %" PRId64 " from '%.*s'",
                tuning.kc, tuning.mc, (int)payload_size, (const char *)payload);
    FUZZ_ASSERT(sneppx_gemm_tuning_check(target, &tuning, reason, sizeof reason) == SNEPPX_OK,
                "a loaded record fails the check: %s", reason);

    /* Round trip: stored back, the same bytes; loaded again, the same values. */
    status = sneppx_gemm_tuning_store(target, &tuning);
    FUZZ_ASSERT(status == SNEPPX_OK, "storing a loaded record: %s", sneppx_last_error());
    void *stored = NULL;
    size_t stored_size = 0;
    FUZZ_ASSERT(sneppx_disk_cache_load(key, fingerprint, &stored, &stored_size, reason, sizeof reason) ==
                        SNEPPX_DISK_HIT &&
                    stored_size == payload_size && memcmp(stored, payload, payload_size) == 0,
                "the stored record is not the loaded text '%.*s' (%s)", (int)payload_size, (const char *)payload,
                reason);
    free(stored);
    struct sneppx_gemm_tuning again = {-1, -1};
    FUZZ_ASSERT(sneppx_gemm_tuning_load(target, &again, reason, sizeof reason) == SNEPPX_TUNING_LOADED &&
                    again.kc == tuning.kc && again.mc == tuning.mc,
                "the record stored back loads as kc %" PRId64 " mc %" PRId64 " (%s)", again.kc, again.mc, reason);

    /* What a GEMM key then carries. */
    sneppx_gemm_tiles_reset();
    int64_t kc, mc, default_kc, default_mc;
    for (int type = SNEPPX_DTYPE_FLOAT32; type < SNEPPX_DTYPE_COUNT; type++) {
        sneppx_gemm_tiles(target, (sneppx_dtype)type, &kc, &mc);
        sneppx_gemm_default_tiles(target, (sneppx_dtype)type, &default_kc, &default_mc);
        const int64_t want_kc = type == SNEPPX_DTYPE_INT8 ? default_kc : tuning.kc;
        const int64_t want_mc = type == SNEPPX_DTYPE_INT8 ? default_mc : tuning.mc;
        FUZZ_ASSERT(kc == want_kc && mc == want_mc,
                    "%s panels on %s get kc %" PRId64 " mc %" PRId64 ", want %" PRId64 ", %" PRId64,
                    sneppx_dtype_name((sneppx_dtype)type), target->name, kc, mc, want_kc, want_mc);
    }
    sneppx_gemm_tiles_reset();
    return 0;
}
