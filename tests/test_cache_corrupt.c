/* Disk cache entries that must not be trusted: truncated, extended, corrupted,
 * foreign (another key's valid entry), of this key but another fingerprint
 * (as another template, LLVM version or CPU would write: payload and its
 * SHA-256 intact), not a sneppx entry, a symbolic link, a FIFO, writable by
 * others, not owned by us, a directory, another key's object bundle under this
 * key's fingerprint (it links no entry of this key). Each is refused
 * (never loaded), the kernel is rebuilt, and the entry is replaced by a valid
 * one that the next process loads (under SNEPPX_JIT=0, the error says why the
 * entry is refused). A lock file that is not one (a directory,
 * FIFO or symbolic link at its name) is refused and left; the kernel is built
 * without it and stored. A store whose first temporary file names are taken
 * (files of a writer that died with the same pid) takes the next free one. */
#include "test_cache_common.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

#include "disk_cache.h"
#include "fingerprint.h"

#define NORM_N 128
#define FOREIGN_N 256

static char dir[CACHE_TEST_DIR_MAX], entry[CACHE_TEST_PATH_MAX], entry_key[SNEPPX_KEY_MAX];
static unsigned char good[1 << 20];
static size_t good_size;

static int read_file(const char *path, unsigned char *data, size_t capacity, size_t *size)
{
    FILE *file = fopen(path, "rb");
    if (!file)
        return -1;
    *size = fread(data, 1, capacity, file);
    int failed = ferror(file) || !feof(file);
    fclose(file);
    return failed ? -1 : 0;
}

static int write_file(const char *path, const unsigned char *data, size_t size)
{
    FILE *file = fopen(path, "wb");
    if (!file)
        return -1;
    size_t written = fwrite(data, 1, size, file);
    return fclose(file) == 0 && written == size ? 0 : -1;
}

/* Removes whatever is at the entry path (file, link, FIFO, directory). */
static void clear_entry(void)
{
    if (unlink(entry) != 0 && errno == EISDIR)
        rmdir(entry);
    rmdir(entry);
}

static const sneppx_kernel *resolve_norm(sneppx_kernel_source *source)
{
    const int64_t values[] = {NORM_N};
    const sneppx_kernel *kernel = NULL;
    sneppx_kernel_timing timing;
    if (sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel) != SNEPPX_OK)
        kernel = NULL;
    sneppx_kernel_last_timing(&timing);
    *source = timing.source;
    return kernel;
}

/* The entry as planted by `plant` is refused and rebuilt; afterwards a fresh
 * resolve loads the replaced entry from disk. */
static void check_rebuilt(test_tally *tally, const char *what, int (*plant)(void))
{
    clear_entry();
    if (plant() != 0) {
        TEST_CHECK(tally, 0, "%s: could not plant the entry: %s", what, strerror(errno));
        return;
    }
    sneppx_kernel_cache_reset_for_testing();
    sneppx_kernel_source source;
    const sneppx_kernel *kernel = resolve_norm(&source);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(tally, kernel && source == SNEPPX_KERNEL_SOURCE_COMPILED && stats.disk_rejects == 1 &&
                          stats.disk_hits == 0 && stats.disk_writes == 1,
               "%s: source %d, %llu rejects, %llu disk hits, %llu writes (want compiled, 1, 0, 1): %s", what,
               source, (unsigned long long)stats.disk_rejects, (unsigned long long)stats.disk_hits,
               (unsigned long long)stats.disk_writes, kernel ? "" : sneppx_last_error());
    if (kernel) {
        double error = cache_test_rmsnorm_error(kernel, NORM_N, NULL);
        TEST_CHECK(tally, error < 1e-6, "%s: rebuilt kernel error %.3g (limit 1e-6)", what, error);
    }
    struct stat info;
    TEST_CHECK(tally, lstat(entry, &info) == 0 && S_ISREG(info.st_mode) && info.st_uid == geteuid() &&
                          (info.st_mode & 077) == 0,
               "%s: the entry is again a private regular file of ours", what);
    sneppx_kernel_cache_reset_for_testing();
    kernel = resolve_norm(&source);
    TEST_CHECK(tally, kernel && source == SNEPPX_KERNEL_SOURCE_DISK, "%s: the replaced entry loads (source %d)",
               what, source);
}

static unsigned char scratch[sizeof good];

static int plant_truncated_payload(void) { return write_file(entry, good, good_size - 1); }
static int plant_truncated_header(void) { return write_file(entry, good, 40); }
static int plant_empty(void) { return write_file(entry, good, 0); }

static int plant_extended(void)
{
    memcpy(scratch, good, good_size);
    memset(scratch + good_size, 0x90, 16);
    return write_file(entry, scratch, good_size + 16);
}

static int plant_flipped_payload_byte(void)
{
    memcpy(scratch, good, good_size);
    scratch[good_size - good_size / 3] ^= 0x01;
    return write_file(entry, scratch, good_size);
}

static int plant_flipped_magic(void)
{
    memcpy(scratch, good, good_size);
    scratch[0] ^= 0x20;
    return write_file(entry, scratch, good_size);
}

/* A valid entry of another key, renamed: its fingerprint names the other key. */
static int plant_foreign(void)
{
    char foreign[CACHE_TEST_PATH_MAX];
    size_t size;
    char key[SNEPPX_KEY_MAX];
    const int64_t values[] = {FOREIGN_N};
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    cache_test_entry_path(dir, key, foreign, sizeof foreign);
    if (read_file(foreign, scratch, sizeof scratch, &size) != 0)
        return -1;
    return write_file(entry, scratch, size);
}

/* The valid entry with its fingerprint replaced by another one, as an entry
 * of this key written by another build or host would carry: found in the
 * header by its value (this file does not know the header's layout). */
static int plant_stale_fingerprint(void)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE], stale[SNEPPX_SHA256_SIZE];
    const char other[] = "the same key, from another template, LLVM version or host";
    if (sneppx_kernel_fingerprint(entry_key, fingerprint) != SNEPPX_OK)
        return -1;
    sneppx_sha256(other, sizeof other, stale);
    memcpy(scratch, good, good_size);
    unsigned char *at = memmem(scratch, good_size, fingerprint, sizeof fingerprint);
    if (!at) {
        errno = ENOENT;
        return -1;
    }
    memcpy(at, stale, sizeof stale);
    return write_file(entry, scratch, good_size);
}

/* An entry that verifies (stored through the cache with this key's fingerprint, its
 * hash its own) but whose payload is no object bundle: as another build of the
 * bundle format, or a hand, could write it. It must not fail the key for good. */
static int plant_unlinkable(void)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    static const char garbage[] = "not an object bundle, though its hash and fingerprint check out";
    int evictions = 0;
    if (sneppx_kernel_fingerprint(entry_key, fingerprint) != SNEPPX_OK ||
        sneppx_disk_cache_store(entry_key, fingerprint, garbage, sizeof garbage, &evictions) != SNEPPX_OK) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* Another key's valid object bundle stored under this key (its fingerprint, its hash):
 * it unpacks and is added to the JIT, but defines none of this key's entries, so the
 * link fails after the add. What was added must go again: the other key links later. */
static int plant_foreign_bundle(void)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE], foreign_fingerprint[SNEPPX_SHA256_SIZE];
    char key[SNEPPX_KEY_MAX], reason[160];
    const int64_t values[] = {FOREIGN_N};
    void *payload = NULL;
    size_t size = 0;
    int evictions = 0;
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    const int ok = sneppx_kernel_fingerprint(key, foreign_fingerprint) == SNEPPX_OK &&
                   sneppx_disk_cache_verify(key, foreign_fingerprint, &payload, &size, reason, sizeof reason) ==
                       SNEPPX_DISK_HIT &&
                   sneppx_kernel_fingerprint(entry_key, fingerprint) == SNEPPX_OK &&
                   sneppx_disk_cache_store(entry_key, fingerprint, payload, size, &evictions) == SNEPPX_OK;
    free(payload);
    errno = ok ? 0 : EIO;
    return ok ? 0 : -1;
}

/* A link to a byte-for-byte valid entry elsewhere: still refused. */
static int plant_symlink(void)
{
    char target[CACHE_TEST_PATH_MAX];
    snprintf(target, sizeof target, "%s.elsewhere", dir);
    if (write_file(target, good, good_size) != 0)
        return -1;
    return symlink(target, entry);
}

static int plant_fifo(void) { return mkfifo(entry, 0600); }

static int plant_world_writable(void)
{
    if (write_file(entry, good, good_size) != 0)
        return -1;
    return chmod(entry, 0666);
}

static int plant_foreign_owner(void)
{
    if (write_file(entry, good, good_size) != 0)
        return -1;
    return chown(entry, 65534, 65534);
}

/* Child, under SNEPPX_JIT=0 with the foreign bundle planted: the key cannot be rebuilt,
 * so its resolve fails naming SNEPPX_JIT=0 and the link, and the other key (whose
 * symbols the failed link added) still links. Exit 0 when both hold. */
static int child_jit_forbidden_unlinkable(void)
{
    const int64_t values[] = {NORM_N}, foreign_values[] = {FOREIGN_N};
    const sneppx_kernel *kernel = NULL, *foreign = NULL;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
    const int refused = status == SNEPPX_ERR_JIT && !kernel && strstr(sneppx_last_error(), "SNEPPX_JIT=0 forbids") &&
                        strstr(sneppx_last_error(), "its disk cache entry does not link");
    fprintf(stderr, "this key: %s '%s'\n", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("rmsnorm", foreign_values, sneppx_host_target(), &foreign);
    fprintf(stderr, "the other key: %s '%s'\n", sneppx_status_name(status), sneppx_last_error());
    return refused && status == SNEPPX_OK ? 0 : 1;
}

/* Child, under SNEPPX_JIT=0 with an entry of another build's fingerprint planted: the
 * resolve fails naming the key and why its entry was refused. Exit 0 when it does. */
static int child_jit_forbidden_stale(void)
{
    const int64_t values[] = {NORM_N};
    const sneppx_kernel *kernel = NULL;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
    fprintf(stderr, "%s '%s'\n", sneppx_status_name(status), sneppx_last_error());
    return status == SNEPPX_ERR_JIT && !kernel && strstr(sneppx_last_error(), "SNEPPX_JIT=0 forbids") &&
                   strstr(sneppx_last_error(), "rmsnorm-n128-") &&
                   strstr(sneppx_last_error(), "its entry is refused: fingerprint differs")
               ? 0
               : 1;
}

#define TAKEN_TEMP_NAMES 3
/* Child, the entry cleared: the names of its first stores' temporary files are
 * taken (files left by a writer that died with this pid, as a container's
 * processes get the same pids run after run). The store takes the next free
 * name, and leaves the others' files alone. Exit 0 when it did. */
static int child_taken_temp_names(void)
{
    char taken[TAKEN_TEMP_NAMES][CACHE_TEST_PATH_MAX];
    for (int i = 0; i < TAKEN_TEMP_NAMES; i++) {
        snprintf(taken[i], sizeof taken[i], "%s/.%s.o.tmp-%ld-%d", dir, entry_key, (long)getpid(), i);
        if (write_file(taken[i], (const unsigned char *)"sneppxK\n", 8) != 0)
            return 2;
    }
    sneppx_kernel_source source;
    const sneppx_kernel *kernel = resolve_norm(&source);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    fprintf(stderr, "source %d, %llu writes: '%s'\n", source, (unsigned long long)stats.disk_writes,
            sneppx_last_error());
    struct stat info;
    int kept = 1;
    for (int i = 0; i < TAKEN_TEMP_NAMES; i++)
        kept &= lstat(taken[i], &info) == 0 && unlink(taken[i]) == 0;
    return kernel && stats.disk_writes == 1 && lstat(entry, &info) == 0 && S_ISREG(info.st_mode) && kept ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "jit-forbidden-unlinkable") == 0)
        return child_jit_forbidden_unlinkable();
    if (argc == 2 && strcmp(argv[1], "jit-forbidden-stale") == 0)
        return child_jit_forbidden_stale();
    if (argc == 2 && strcmp(argv[1], "taken-temp-names") == 0) {
        /* The parent's directory and key (SNEPPX_CACHE_DIR is set for the child). */
        snprintf(dir, sizeof dir, "%s", getenv("SNEPPX_CACHE_DIR"));
        const int64_t values[] = {NORM_N};
        sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), entry_key, sizeof entry_key);
        cache_test_entry_path(dir, entry_key, entry, sizeof entry);
        return child_taken_temp_names();
    }
    test_tally tally = {0};
    if (cache_test_make_dir(dir, sizeof dir, "corrupt") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_JIT");
    const int64_t foreign_values[] = {FOREIGN_N};
    const sneppx_kernel *foreign = NULL;
    sneppx_kernel_source source;
    const sneppx_kernel *kernel = resolve_norm(&source);
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", foreign_values, sneppx_host_target(), &foreign);
    if (!kernel || status != SNEPPX_OK) {
        TEST_CHECK(&tally, 0, "first compile: %s", sneppx_last_error());
        return test_finish(&tally);
    }
    cache_test_entry_path(dir, kernel->key, entry, sizeof entry);
    snprintf(entry_key, sizeof entry_key, "%s", kernel->key);
    if (read_file(entry, good, sizeof good, &good_size) != 0 || good_size < 128) {
        TEST_CHECK(&tally, 0, "entry %s unreadable", entry);
        return test_finish(&tally);
    }

    check_rebuilt(&tally, "payload one byte short", plant_truncated_payload);
    check_rebuilt(&tally, "header cut at 40 bytes", plant_truncated_header);
    check_rebuilt(&tally, "empty file", plant_empty);
    check_rebuilt(&tally, "16 bytes appended", plant_extended);
    check_rebuilt(&tally, "one payload bit flipped", plant_flipped_payload_byte);
    check_rebuilt(&tally, "magic changed", plant_flipped_magic);
    check_rebuilt(&tally, "another key's entry", plant_foreign);
    /* The stale fingerprint is the one reason given. */
    char reason[160] = "";
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    clear_entry();
    sneppx_kernel_fingerprint(entry_key, fingerprint);
    TEST_CHECK(&tally, plant_stale_fingerprint() == 0 &&
                           sneppx_disk_cache_verify(entry_key, fingerprint, NULL, NULL, reason, sizeof reason) ==
                               SNEPPX_DISK_REJECTED &&
                           strstr(reason, "fingerprint differs"),
               "an entry of this key with a stale fingerprint: refused because '%s'", reason);
    /* Where nothing may be compiled, the error says why the entry there is refused. */
    {
        const char *forbid[] = {"SNEPPX_JIT=0", NULL};
        char *child_stderr = NULL;
        const int code = cache_test_run_child("jit-forbidden-stale", forbid, &child_stderr);
        TEST_CHECK(&tally, code == 0, "SNEPPX_JIT=0 and an entry of another fingerprint: exit %d: %s", code,
                   child_stderr ? child_stderr : "");
        free(child_stderr);
    }
    check_rebuilt(&tally, "this key's entry with a stale fingerprint", plant_stale_fingerprint);
    check_rebuilt(&tally, "symbolic link to a valid entry", plant_symlink);
    check_rebuilt(&tally, "a verified entry that does not link", plant_unlinkable);
    check_rebuilt(&tally, "another key's object bundle under this key's fingerprint", plant_foreign_bundle);
    /* Where nothing may be compiled, the same entry fails the key, naming why. */
    clear_entry();
    if (TEST_CHECK(&tally, plant_foreign_bundle() == 0, "plant the foreign bundle: %s", strerror(errno))) {
        const char *forbid[] = {"SNEPPX_JIT=0", NULL};
        char *child_stderr = NULL;
        const int code = cache_test_run_child("jit-forbidden-unlinkable", forbid, &child_stderr);
        TEST_CHECK(&tally, code == 0, "SNEPPX_JIT=0 and an entry that does not link: exit %d: %s", code,
                   child_stderr ? child_stderr : "");
        free(child_stderr);
    }
    /* The other key's symbols, added by the failed link, went with it: it links now. */
    sneppx_kernel_cache_reset_for_testing();
    foreign = NULL;
    status = sneppx_kernel_resolve("rmsnorm", foreign_values, sneppx_host_target(), &foreign);
    TEST_CHECK(&tally, status == SNEPPX_OK && foreign && cache_test_rmsnorm_error(foreign, FOREIGN_N, NULL) < 1e-6,
               "the key whose bundle failed to link under another key: %s '%s'", sneppx_status_name(status),
               sneppx_last_error());
    check_rebuilt(&tally, "FIFO", plant_fifo);
    check_rebuilt(&tally, "writable by everyone", plant_world_writable);
    if (geteuid() == 0)
        check_rebuilt(&tally, "owned by another user", plant_foreign_owner);
    else
        tally.skipped++; /* only root can give a file away */
    sneppx_jit_stats stats;

    /* Something not a lock file squats the key's lock (a directory, a FIFO, a symbolic link
     * to a file of ours): refused and left alone; the kernel is built without the lock,
     * stored, and loads from disk in the next resolve. */
    char lock[CACHE_TEST_PATH_MAX], target[CACHE_TEST_PATH_MAX + 8];
    snprintf(lock, sizeof lock, "%s/%s.lock", dir, entry_key);
    snprintf(target, sizeof target, "%s.target", entry);
    for (int squatter = 0; squatter < 3; squatter++) {
        static const char *const names[] = {"directory", "FIFO", "symbolic link"};
        clear_entry();
        unlink(lock);
        rmdir(lock);
        const int planted = squatter == 0   ? mkdir(lock, 0700)
                            : squatter == 1 ? mkfifo(lock, 0600)
                                            : write_file(target, good, 0) || symlink(target, lock);
        sneppx_kernel_cache_reset_for_testing();
        kernel = resolve_norm(&source);
        sneppx_jit_stats_get(&stats);
        struct stat info;
        TEST_CHECK(&tally, planted == 0 && kernel && source == SNEPPX_KERNEL_SOURCE_COMPILED &&
                               stats.disk_writes == 1 && lstat(lock, &info) == 0 &&
                               (squatter == 0   ? S_ISDIR(info.st_mode)
                                : squatter == 1 ? S_ISFIFO(info.st_mode)
                                                : S_ISLNK(info.st_mode)),
                   "a %s at the lock file: planted %d, source %d, %llu writes, still there: %d", names[squatter],
                   planted, source, (unsigned long long)stats.disk_writes, lstat(lock, &info) == 0);
        sneppx_kernel_cache_reset_for_testing();
        kernel = resolve_norm(&source);
        TEST_CHECK(&tally, kernel && source == SNEPPX_KERNEL_SOURCE_DISK,
                   "a %s at the lock file: the stored entry loads (source %d)", names[squatter], source);
    }
    unlink(lock);
    rmdir(lock);
    unlink(target);

    /* The names of a store's temporary files are taken: it takes the next one. */
    clear_entry();
    char *taken_stderr = NULL;
    const int taken_code = cache_test_run_child("taken-temp-names", NULL, &taken_stderr);
    TEST_CHECK(&tally, taken_code == 0, "the first %d temporary file names taken: exit %d: %s", TAKEN_TEMP_NAMES,
               taken_code, taken_stderr ? taken_stderr : "");
    free(taken_stderr);

    /* A directory squats the entry: refused, and the kernel still runs from memory. */
    clear_entry();
    mkdir(entry, 0700);
    sneppx_kernel_cache_reset_for_testing();
    kernel = resolve_norm(&source);
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, kernel && source == SNEPPX_KERNEL_SOURCE_COMPILED && stats.disk_rejects == 1 &&
                           stats.disk_writes == 0,
               "directory at the entry: source %d, %llu rejects, %llu writes", source,
               (unsigned long long)stats.disk_rejects, (unsigned long long)stats.disk_writes);
    if (kernel)
        TEST_CHECK(&tally, cache_test_rmsnorm_error(kernel, NORM_N, NULL) < 1e-6, "memory-only kernel computes");

    char elsewhere[CACHE_TEST_PATH_MAX];
    snprintf(elsewhere, sizeof elsewhere, "%s.elsewhere", dir);
    unlink(elsewhere);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
