/* Fuzzes the disk cache's entry loader: the input's first byte is a control
 * byte, the rest becomes the file <cache>/<key>.o (ours), and
 * sneppx_disk_cache_load() and sneppx_disk_cache_verify() judge it against a
 * fixed fingerprint. A mutated entry fails its payload SHA-256 almost always,
 * so the control byte lets the harness repair what a mutation breaks before
 * the file is written, and mutated headers and payloads reach the checks past
 * the digest:
 *   bit 0  the payload SHA-256 field becomes the SHA-256 of the file's tail
 *          (the bytes after the 88-byte header), computed by the library's own
 *          sneppx_sha256;
 *   bit 1  the payload size field becomes the tail's length;
 *   bit 2  the file is group-writable (mode 0620 instead of 0600);
 *   bit 3  then the tail is stored through sneppx_disk_cache_store().
 * (A control byte of 0 takes the file as it is: the seeds are entries the
 * library wrote, each behind a 0, or behind the bits that repair it.)
 *
 * Promises: load and verify agree, and give the verdict the entry format
 * (docs/SECURITY.md, "Disk cache") gives, which the harness computes on its
 * own: a hit exactly when the file is not writable by group or others, holds
 * the whole header, starts with the magic, has format version 1 and header
 * size 88, this fingerprint, a payload size of at most 256 MiB equal to the
 * file's size minus the header, and the SHA-256 of its payload; a hit's
 * payload is exactly the file's tail (nothing read beyond the file); a
 * rejection says why; a miss cannot happen while the file exists. A store
 * writes exactly the header the format gives followed by the payload, and
 * loads back as a hit with that payload. The cache directory is a private one
 * under /dev/shm (or $TMPDIR), made at startup. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk_cache.h"
#include "fingerprint.h"
#include "fuzz.h"

static const char key[] = "rmsnorm-n64-v16";
/* The fingerprint every seed entry was written with (seeds: fuzz/corpus/cache_entry/). */
static const uint8_t fingerprint[SNEPPX_SHA256_SIZE] = {
    0x73, 0x6e, 0x65, 0x70, 0x70, 0x78, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2d, 0x63, 0x61, 0x63, 0x68,
    0x65, 0x2d, 0x65, 0x6e, 0x74, 0x72, 0x79, 0x2d, 0x66, 0x69, 0x6e, 0x67, 0x65, 0x72, 0x70, 0x72};
static char entry_path[PATH_MAX];

/* The entry format, as docs/SECURITY.md describes it, written down here rather
 * than taken from disk_cache.c: the harness's model of what must load. Native
 * byte order, no padding. */
#define MAGIC "sneppxK\n"
#define FORMAT_VERSION 1u
#define OFFSET_VERSION 8
#define OFFSET_HEADER_SIZE 12
#define OFFSET_PAYLOAD_SIZE 16
#define OFFSET_FINGERPRINT 24
#define OFFSET_DIGEST (OFFSET_FINGERPRINT + SNEPPX_SHA256_SIZE)
#define HEADER_SIZE (OFFSET_DIGEST + SNEPPX_SHA256_SIZE) /* 88 */
#define MAX_PAYLOAD ((uint64_t)256 << 20)

#define REHASH 1u
#define RESIZE 2u
#define GROUP_WRITABLE 4u
#define STORE 8u

/* The private directory goes when the fuzzer exits. */
static void remove_cache(void)
{
    unlink(entry_path);
    rmdir(sneppx_disk_cache_path());
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[PATH_MAX];
    if (fuzz_private_dir("sneppx-fuzz-cache", dir, sizeof dir) != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0 || !sneppx_disk_cache_path()) {
        fprintf(stderr, "fuzz_cache_entry: no private cache directory at %s\n", dir);
        exit(1);
    }
    snprintf(entry_path, sizeof entry_path, "%s/%s.o", sneppx_disk_cache_path(), key);
    atexit(remove_cache);
    return 0;
}

/* The header the format gives a payload. */
static void make_header(const uint8_t *payload, size_t size, uint8_t header[HEADER_SIZE])
{
    const uint32_t version = FORMAT_VERSION, header_size = HEADER_SIZE;
    const uint64_t payload_size = size;
    memcpy(header, MAGIC, 8);
    memcpy(header + OFFSET_VERSION, &version, sizeof version);
    memcpy(header + OFFSET_HEADER_SIZE, &header_size, sizeof header_size);
    memcpy(header + OFFSET_PAYLOAD_SIZE, &payload_size, sizeof payload_size);
    memcpy(header + OFFSET_FINGERPRINT, fingerprint, SNEPPX_SHA256_SIZE);
    sneppx_sha256(payload, size, header + OFFSET_DIGEST);
}

/* Whether the format trusts the file (its bytes and whether group may write it). */
static int trusted(const uint8_t *file, size_t size, int group_writable)
{
    if (group_writable || size < HEADER_SIZE || memcmp(file, MAGIC, 8) != 0)
        return 0;
    uint32_t version, header_size;
    uint64_t payload_size;
    memcpy(&version, file + OFFSET_VERSION, sizeof version);
    memcpy(&header_size, file + OFFSET_HEADER_SIZE, sizeof header_size);
    memcpy(&payload_size, file + OFFSET_PAYLOAD_SIZE, sizeof payload_size);
    if (version != FORMAT_VERSION || header_size != HEADER_SIZE ||
        memcmp(file + OFFSET_FINGERPRINT, fingerprint, SNEPPX_SHA256_SIZE) != 0)
        return 0;
    if (payload_size > MAX_PAYLOAD || payload_size != size - HEADER_SIZE)
        return 0;
    uint8_t digest[SNEPPX_SHA256_SIZE];
    sneppx_sha256(file + HEADER_SIZE, size - HEADER_SIZE, digest);
    return memcmp(digest, file + OFFSET_DIGEST, SNEPPX_SHA256_SIZE) == 0;
}

static void write_entry(const uint8_t *file, size_t size, mode_t mode)
{
    int fd = open(entry_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    FUZZ_ASSERT(fd >= 0, "cannot write %s", entry_path);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, file + done, size - done);
        FUZZ_ASSERT(n > 0, "cannot write %s", entry_path);
        done += (size_t)n;
    }
    FUZZ_ASSERT(fchmod(fd, mode) == 0, "cannot chmod %s", entry_path);
    close(fd);
}

/* Loads and verifies the entry; checks the promises against the model's verdict. */
static void judge(const uint8_t *file, size_t size, int group_writable)
{
    void *object = NULL;
    size_t object_size = 0;
    char reason[160] = "", verify_reason[160] = "";
    sneppx_disk_load loaded = sneppx_disk_cache_load(key, fingerprint, &object, &object_size, reason, sizeof reason);
    sneppx_disk_load verified =
        sneppx_disk_cache_verify(key, fingerprint, NULL, NULL, verify_reason, sizeof verify_reason);
    FUZZ_ASSERT(loaded == verified, "load says %d (%s), verify says %d (%s)", (int)loaded, reason, (int)verified,
                verify_reason);
    FUZZ_ASSERT(loaded != SNEPPX_DISK_MISS, "an existing entry of %zu bytes was a miss", size);
    const int expected = trusted(file, size, group_writable);
    FUZZ_ASSERT((loaded == SNEPPX_DISK_HIT) == expected, "a %zu-byte entry%s: %s, where the format says %s", size,
                group_writable ? " (group-writable)" : "", loaded == SNEPPX_DISK_HIT ? "hit" : reason,
                expected ? "hit" : "rejected");
    if (loaded == SNEPPX_DISK_HIT) {
        FUZZ_ASSERT(object && object_size < size && memcmp(object, file + (size - object_size), object_size) == 0,
                    "a hit's %zu-byte payload is not the tail of the %zu-byte file", object_size, size);
    } else {
        FUZZ_ASSERT(reason[0] != '\0', "a rejection without a reason");
    }
    free(object);
}

/* Stores payload, then reads the file back: the format's header and the payload. */
static void store(const uint8_t *payload, size_t size)
{
    int evicted = 0;
    sneppx_status status = sneppx_disk_cache_store(key, fingerprint, payload, size, &evicted);
    FUZZ_ASSERT(status == SNEPPX_OK && evicted == 0, "store of %zu bytes: %s (%d evicted)", size,
                sneppx_last_error(), evicted);
    uint8_t *expected = malloc(HEADER_SIZE + size), *written = malloc(HEADER_SIZE + size + 1);
    FUZZ_ASSERT(expected && written, "out of memory");
    make_header(payload, size, expected);
    memcpy(expected + HEADER_SIZE, payload, size);
    int fd = open(entry_path, O_RDONLY | O_CLOEXEC);
    FUZZ_ASSERT(fd >= 0, "the stored entry %s is missing", entry_path);
    size_t got = 0;
    for (ssize_t n; got < HEADER_SIZE + size + 1 && (n = read(fd, written + got, HEADER_SIZE + size + 1 - got)) > 0;)
        got += (size_t)n;
    close(fd);
    FUZZ_ASSERT(got == HEADER_SIZE + size && memcmp(written, expected, got) == 0,
                "the store of a %zu-byte payload wrote %zu bytes other than the format's header and the payload",
                size, got);
    judge(expected, HEADER_SIZE + size, 0);
    free(expected);
    free(written);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const unsigned control = size ? data[0] : 0;
    const uint8_t *input = size ? data + 1 : data;
    const size_t file_size = size ? size - 1 : 0;
    uint8_t *file = malloc(file_size ? file_size : 1);
    FUZZ_ASSERT(file, "out of memory");
    memcpy(file, input, file_size);
    if (file_size >= HEADER_SIZE) {
        if (control & RESIZE) {
            const uint64_t payload_size = file_size - HEADER_SIZE;
            memcpy(file + OFFSET_PAYLOAD_SIZE, &payload_size, sizeof payload_size);
        }
        if (control & REHASH)
            sneppx_sha256(file + HEADER_SIZE, file_size - HEADER_SIZE, file + OFFSET_DIGEST);
    }
    const int group_writable = (control & GROUP_WRITABLE) != 0;
    write_entry(file, file_size, group_writable ? 0620 : 0600);
    judge(file, file_size, group_writable);
    if (control & STORE) {
        const size_t skip = file_size < HEADER_SIZE ? file_size : HEADER_SIZE;
        store(file + skip, file_size - skip);
    }
    free(file);
    return 0;
}
