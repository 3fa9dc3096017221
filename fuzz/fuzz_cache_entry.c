/* Fuzzes the disk cache's entry loader: the input becomes the file
 * <cache>/<key>.o (mode 0600, ours) and sneppx_disk_cache_load() and
 * sneppx_disk_cache_verify() judge it against a fixed fingerprint. Promises:
 * the two agree; a hit returns a payload that is exactly the file's tail (the
 * bytes after the header, nothing read beyond the file); a miss cannot happen
 * while the file exists. The cache directory is a private one under
 * /dev/shm (or $TMPDIR), made at startup. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "disk_cache.h"
#include "fuzz.h"

static const char key[] = "rmsnorm-n64-v16";
/* The fingerprint every seed entry was written with (seeds: fuzz/corpus/cache_entry/). */
static const uint8_t fingerprint[SNEPPX_SHA256_SIZE] = {
    0x73, 0x6e, 0x65, 0x70, 0x70, 0x78, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2d, 0x63, 0x61, 0x63, 0x68,
    0x65, 0x2d, 0x65, 0x6e, 0x74, 0x72, 0x79, 0x2d, 0x66, 0x69, 0x6e, 0x67, 0x65, 0x72, 0x70, 0x72};
static char entry_path[PATH_MAX];

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = open(entry_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    FUZZ_ASSERT(fd >= 0, "cannot write %s", entry_path);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        FUZZ_ASSERT(n > 0, "cannot write %s", entry_path);
        done += (size_t)n;
    }
    close(fd);

    void *object = NULL;
    size_t object_size = 0;
    char reason[160] = "", verify_reason[160] = "";
    sneppx_disk_load loaded = sneppx_disk_cache_load(key, fingerprint, &object, &object_size, reason, sizeof reason);
    sneppx_disk_load verified =
        sneppx_disk_cache_verify(key, fingerprint, NULL, NULL, verify_reason, sizeof verify_reason);
    FUZZ_ASSERT(loaded == verified, "load says %d (%s), verify says %d (%s)", (int)loaded, reason, (int)verified,
                verify_reason);
    FUZZ_ASSERT(loaded != SNEPPX_DISK_MISS, "an existing entry of %zu bytes was a miss", size);
    if (loaded == SNEPPX_DISK_HIT) {
        FUZZ_ASSERT(object && object_size < size && memcmp(object, data + (size - object_size), object_size) == 0,
                    "a hit's %zu-byte payload is not the tail of the %zu-byte file", object_size, size);
    } else {
        FUZZ_ASSERT(reason[0] != '\0', "a rejection without a reason");
    }
    free(object);
    return 0;
}
