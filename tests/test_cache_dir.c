/* The disk cache directory: where it is ($SNEPPX_CACHE_DIR, else
 * $XDG_CACHE_HOME/sneppx, else ~/.cache/sneppx, created 0700), which ones are
 * refused (others may write it, not ours, a path too long, cannot be
 * created: memory-only with exactly one warning that says why), which are
 * read-only (not writable: loaded, never written; tests/test_cache_read_only.c
 * runs a warmed one), stale probe files, SNEPPX_JIT=0 on a cold cache (an
 * error naming the key), SNEPPX_CACHE_MAX_MB (least recently used entries
 * evicted; a positive size below one byte is the smallest bound) and the
 * checks of SNEPPX_CACHE_MAX_MB and SNEPPX_CACHE_LOCK_TIMEOUT. The directory
 * is resolved once per process, so each case runs this binary again as a
 * child with its own environment. */
#include "test_cache_common.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "disk_cache.h"

#define EXPECT_DIR "SNEPPX_TEST_EXPECT_DIR" /* the child's expected sneppx_cache_dir(), "" = memory-only */
#define EXPECT_READ_ONLY "SNEPPX_TEST_EXPECT_READ_ONLY" /* 1 or 0 when set */

static const int64_t first_values[] = {96}, second_values[] = {112}, third_values[] = {128};

static const sneppx_kernel *resolve_norm(test_tally *tally, const int64_t *values, sneppx_kernel_source *source)
{
    const sneppx_kernel *kernel = NULL;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", values, sneppx_host_target(), &kernel);
    sneppx_kernel_timing timing;
    sneppx_kernel_last_timing(&timing);
    if (source)
        *source = timing.source;
    TEST_CHECK(tally, status == SNEPPX_OK, "rmsnorm n%lld: %s %s", (long long)values[0],
               sneppx_status_name(status), sneppx_last_error());
    if (kernel) {
        double error = cache_test_rmsnorm_error(kernel, values[0], NULL);
        TEST_CHECK(tally, error < 1e-6, "%s: normalized error %.3g (limit 1e-6)", kernel->key, error);
    }
    return kernel;
}

/* ---- child scenarios (this binary run as `test_cache_dir <scenario>`) ---- */

/* Resolves two kernels; the cache directory must be $SNEPPX_TEST_EXPECT_DIR. */
static int child_resolve(void)
{
    test_tally tally = {0};
    if (getenv(EXPECT_READ_ONLY))
        TEST_CHECK(&tally, sneppx_disk_cache_read_only() == atoi(getenv(EXPECT_READ_ONLY)),
                   "read-only %d, want %s", sneppx_disk_cache_read_only(), getenv(EXPECT_READ_ONLY));
    const char *expected = getenv(EXPECT_DIR);
    const char *dir = sneppx_cache_dir(); /* creates it */
    char resolved[PATH_MAX] = "";
    if (expected && expected[0] && !realpath(expected, resolved))
        snprintf(resolved, sizeof resolved, "(%s does not exist)", expected);
    TEST_CHECK(&tally, strcmp(dir, resolved) == 0, "cache dir '%s', want '%s'", dir, resolved);
    for (int i = 0; i < 2; i++) /* asking again must not warn again */
        TEST_CHECK(&tally, strcmp(sneppx_cache_dir(), resolved) == 0, "cache dir '%s', want '%s'",
                   sneppx_cache_dir(), resolved);
    resolve_norm(&tally, first_values, NULL);
    resolve_norm(&tally, second_values, NULL);
    return test_finish(&tally);
}

/* SNEPPX_JIT=0 on a cold cache: an error that names the exact key. */
static int child_jit_forbidden(void)
{
    test_tally tally = {0};
    const sneppx_kernel *kernel = NULL;
    char key[SNEPPX_KEY_MAX];
    sneppx_kernel_key("rmsnorm", first_values, sneppx_host_target(), key, sizeof key);
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", first_values, sneppx_host_target(), &kernel);
    char quoted[SNEPPX_KEY_MAX + 2];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    TEST_CHECK(&tally, status == SNEPPX_ERR_JIT && !kernel && strstr(sneppx_last_error(), quoted) &&
                           strstr(sneppx_last_error(), "SNEPPX_JIT=0"),
               "got %s '%s', want SNEPPX_ERR_JIT naming %s", sneppx_status_name(status), sneppx_last_error(),
               quoted);
    /* A second attempt fails the same way (a failed build is not cached). */
    status = sneppx_kernel_resolve("rmsnorm", first_values, sneppx_host_target(), &kernel);
    TEST_CHECK(&tally, status == SNEPPX_ERR_JIT && strstr(sneppx_last_error(), quoted), "second attempt: %s '%s'",
               sneppx_status_name(status), sneppx_last_error());
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, stats.compiles == 0, "%llu compiles under SNEPPX_JIT=0", (unsigned long long)stats.compiles);
    return test_finish(&tally);
}

/* Compiles the three keys (the parent measures their entries). */
static int child_compile_three(void)
{
    test_tally tally = {0};
    resolve_norm(&tally, first_values, NULL);
    resolve_norm(&tally, second_values, NULL);
    resolve_norm(&tally, third_values, NULL);
    return test_finish(&tally);
}

static int entry_exists(const int64_t *values)
{
    char key[SNEPPX_KEY_MAX], path[CACHE_TEST_PATH_MAX];
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    return cache_test_entry_path(sneppx_cache_dir(), key, path, sizeof path) == 0 && access(path, F_OK) == 0;
}

/* With a bound that holds two entries: A, B written; A used again; C written
 * evicts B, the least recently used, and keeps A and C. */
static int child_evict(void)
{
    test_tally tally = {0};
    sneppx_kernel_source source;
    struct timespec pause = {0, 20 * 1000 * 1000};
    resolve_norm(&tally, first_values, &source);
    nanosleep(&pause, NULL);
    resolve_norm(&tally, second_values, &source);
    nanosleep(&pause, NULL);
    sneppx_kernel_cache_reset_for_testing();
    resolve_norm(&tally, first_values, &source);
    TEST_CHECK(&tally, source == SNEPPX_KERNEL_SOURCE_DISK, "A again: from disk (source %d)", source);
    nanosleep(&pause, NULL);
    resolve_norm(&tally, third_values, &source);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, stats.evictions == 1, "%llu evictions, want 1", (unsigned long long)stats.evictions);
    TEST_CHECK(&tally, entry_exists(first_values) && !entry_exists(second_values) && entry_exists(third_values),
               "kept A and C, evicted B: A %d B %d C %d", entry_exists(first_values), entry_exists(second_values),
               entry_exists(third_values));
    return test_finish(&tally);
}

/* Plants the probe files a process that died in the middle of its probe
 * would leave, under this process's pid (the names disk_cache.c tries
 * first: the name of old versions, then attempts 0 to 3), then resolves. */
static int child_stale_probe(void)
{
    const char *dir = getenv("SNEPPX_CACHE_DIR");
    char path[CACHE_TEST_PATH_MAX];
    for (int attempt = -1; attempt < 4; attempt++) {
        if (attempt < 0)
            snprintf(path, sizeof path, "%s/.probe-%ld", dir, (long)getpid());
        else
            snprintf(path, sizeof path, "%s/.probe-%ld-%d", dir, (long)getpid(), attempt);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            fprintf(stderr, "cannot plant %s: %s\n", path, strerror(errno));
            return 1;
        }
        close(fd);
    }
    return child_resolve();
}

/* SNEPPX_CACHE_MAX_MB below one byte: the bound is one byte, so storing the
 * second key evicts the first. */
static int child_tiny_bound(void)
{
    test_tally tally = {0};
    TEST_CHECK(&tally, sneppx_disk_cache_max_bytes() == 1, "SNEPPX_CACHE_MAX_MB=%s: a bound of %llu bytes, want 1",
               getenv("SNEPPX_CACHE_MAX_MB"), (unsigned long long)sneppx_disk_cache_max_bytes());
    resolve_norm(&tally, first_values, NULL);
    resolve_norm(&tally, second_values, NULL);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, stats.evictions == 1 && !entry_exists(first_values) && entry_exists(second_values),
               "%llu evictions (want 1); first entry %d (want 0), second %d (want 1)",
               (unsigned long long)stats.evictions, entry_exists(first_values), entry_exists(second_values));
    return test_finish(&tally);
}

/* Prints the settings as the disk cache read them. */
static int child_settings(void)
{
    printf("max_bytes %llu lock_timeout %.17g\n", (unsigned long long)sneppx_disk_cache_max_bytes(),
           sneppx_disk_cache_lock_timeout());
    return 0;
}

/* ---- the parent: one child per case ---------------------------------------- */

static char base[CACHE_TEST_DIR_MAX];

/* Runs a child; checks its exit code, the number of warnings, and that the
 * one warning (if any) contains reason. */
static void expect_child(test_tally *tally, const char *what, const char *scenario, const char *const *env,
                         int warnings, const char *reason)
{
    char *text = NULL;
    int code = cache_test_run_child(scenario, env, &text);
    int seen = cache_test_count(text, "warning:");
    TEST_CHECK(tally, code == 0, "%s: child exit %d, stderr:\n%s", what, code, text ? text : "");
    TEST_CHECK(tally, seen == warnings && (!reason || (text && strstr(text, reason))),
               "%s: %d warnings (want %d%s%s), stderr:\n%s", what, seen, warnings, reason ? " naming " : "",
               reason ? reason : "", text ? text : "");
    free(text);
}

static void check_mode(test_tally *tally, const char *path, unsigned mode)
{
    struct stat info;
    int ok = stat(path, &info) == 0 && S_ISDIR(info.st_mode) && (info.st_mode & 07777) == mode;
    TEST_CHECK(tally, ok, "%s: a directory of mode %04o", path, mode);
}

static void path_in_base(char *path, size_t size, const char *name)
{
    if (snprintf(path, size, "%s/%s", base, name) >= (int)size)
        path[0] = '\0';
}

static void test_locations(test_tally *tally)
{
    char dir[CACHE_TEST_PATH_MAX], parent[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX];
    char expect[CACHE_TEST_ENV_MAX], env_other[CACHE_TEST_ENV_MAX];

    path_in_base(parent, sizeof parent, "made");
    path_in_base(dir, sizeof dir, "made/deeper/sneppx");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    snprintf(expect, sizeof expect, EXPECT_DIR "=%s", dir);
    const char *explicit_env[] = {env_dir, expect, NULL};
    expect_child(tally, "SNEPPX_CACHE_DIR created", "resolve", explicit_env, 0, NULL);
    check_mode(tally, parent, 0700);
    check_mode(tally, dir, 0700);
    TEST_CHECK(tally, cache_test_count_entries(dir) == 2, "%s holds the 2 entries: %d", dir,
               cache_test_count_entries(dir));

    path_in_base(dir, sizeof dir, "xdg");
    snprintf(env_other, sizeof env_other, "XDG_CACHE_HOME=%s", dir);
    snprintf(expect, sizeof expect, EXPECT_DIR "=%s/sneppx", dir);
    const char *xdg_env[] = {"SNEPPX_CACHE_DIR", env_other, expect, NULL};
    expect_child(tally, "XDG_CACHE_HOME/sneppx", "resolve", xdg_env, 0, NULL);

    path_in_base(dir, sizeof dir, "home");
    snprintf(env_other, sizeof env_other, "HOME=%s", dir);
    snprintf(expect, sizeof expect, EXPECT_DIR "=%s/.cache/sneppx", dir);
    const char *home_env[] = {"SNEPPX_CACHE_DIR", "XDG_CACHE_HOME", env_other, expect, NULL};
    expect_child(tally, "HOME/.cache/sneppx", "resolve", home_env, 0, NULL);
    /* The XDG spec ignores a relative XDG_CACHE_HOME. */
    const char *relative_env[] = {"SNEPPX_CACHE_DIR", "XDG_CACHE_HOME=relative/cache", env_other, expect, NULL};
    expect_child(tally, "relative XDG_CACHE_HOME ignored", "resolve", relative_env, 0, NULL);
}

/* A directory with mode (and owner, when uid >= 0) that is refused: memory-only, one warning. */
static void expect_refused(test_tally *tally, const char *what, const char *name, unsigned mode, int uid,
                           const char *reason)
{
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, name);
    if (mkdir(dir, 0700) != 0 || chmod(dir, mode) != 0 || (uid >= 0 && chown(dir, (uid_t)uid, (gid_t)uid) != 0)) {
        TEST_CHECK(tally, 0, "%s: cannot prepare %s: %s", what, dir, strerror(errno));
        return;
    }
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *env[] = {env_dir, EXPECT_DIR "=", NULL};
    expect_child(tally, what, "resolve", env, 1, reason);
    TEST_CHECK(tally, cache_test_count_entries(dir) == 0, "%s: nothing written into the refused %s", what, dir);
}

static void test_refusals(test_tally *tally)
{
    expect_refused(tally, "world-writable directory", "world", 0777, -1, "writable by group or others");
    expect_refused(tally, "group-writable directory", "group", 0770, -1, "writable by group or others");
    if (geteuid() == 0)
        expect_refused(tally, "directory of another user", "theirs", 0700, 65534, "owned by uid 65534");
    else
        tally->skipped++; /* only root can give a directory away */

    /* Sticky and world-writable but ours (like /tmp): accepted. */
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX], expect[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, "sticky");
    mkdir(dir, 0700);
    chmod(dir, 01777);
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    snprintf(expect, sizeof expect, EXPECT_DIR "=%s", dir);
    const char *sticky_env[] = {env_dir, expect, NULL};
    expect_child(tally, "sticky world-writable directory of ours", "resolve", sticky_env, 0, NULL);

    /* Unwritable: a read-only cache, whose entries would load. Kernels
     * compiled there stay in memory, with one warning at the first store.
     * Root writes through permissions, but not into /proc. */
    if (geteuid() == 0) {
        const char *proc_env[] = {"SNEPPX_CACHE_DIR=/proc", EXPECT_DIR "=/proc", EXPECT_READ_ONLY "=1", NULL};
        expect_child(tally, "unwritable directory (/proc)", "resolve", proc_env, 1, "/proc is read-only");
    } else {
        path_in_base(dir, sizeof dir, "readonly");
        mkdir(dir, 0500);
        snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
        snprintf(expect, sizeof expect, EXPECT_DIR "=%s", dir);
        const char *readonly_env[] = {env_dir, expect, EXPECT_READ_ONLY "=1", NULL};
        expect_child(tally, "unwritable directory", "resolve", readonly_env, 1, "is read-only");
    }

    /* Longer than PATH_MAX: says so, and names the variable. */
    char long_env[PATH_MAX + 64];
    int length = snprintf(long_env, sizeof long_env, "SNEPPX_CACHE_DIR=%s/", base);
    memset(long_env + length, 'd', sizeof long_env - (size_t)length - 1);
    long_env[sizeof long_env - 1] = '\0';
    const char *long_dir_env[] = {long_env, EXPECT_DIR "=", NULL};
    expect_child(tally, "SNEPPX_CACHE_DIR longer than PATH_MAX", "resolve", long_dir_env, 1,
                 "$SNEPPX_CACHE_DIR is too long");

    /* Cannot be created: its parent is a regular file. */
    char file[CACHE_TEST_PATH_MAX];
    path_in_base(file, sizeof file, "a-file");
    FILE *plain = fopen(file, "w");
    if (plain)
        fclose(plain);
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s/sneppx", file);
    const char *uncreatable_env[] = {env_dir, EXPECT_DIR "=", NULL};
    expect_child(tally, "directory under a regular file", "resolve", uncreatable_env, 1, "cannot create");
}

static void test_jit_forbidden(test_tally *tally)
{
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, "cold");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *cold_env[] = {env_dir, "SNEPPX_JIT=0", NULL};
    expect_child(tally, "SNEPPX_JIT=0, cold cache", "jit-forbidden", cold_env, 0, NULL);
    path_in_base(dir, sizeof dir, "cold-world-writable");
    mkdir(dir, 0700);
    chmod(dir, 0777);
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *memory_env[] = {env_dir, "SNEPPX_JIT=0", NULL};
    expect_child(tally, "SNEPPX_JIT=0, memory-only", "jit-forbidden", memory_env, 1, "writable by group or others");
}

/* A stale probe file under the probing process's pid: the directory is
 * still writable (the next name is tried), not refused as "File exists". */
static void test_stale_probe(test_tally *tally)
{
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX], expect[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, "stale-probe");
    mkdir(dir, 0700);
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    snprintf(expect, sizeof expect, EXPECT_DIR "=%s", dir);
    const char *env[] = {env_dir, expect, EXPECT_READ_ONLY "=0", NULL};
    expect_child(tally, "stale probe files", "stale-probe", env, 0, NULL);
    TEST_CHECK(tally, cache_test_count_entries(dir) == 2, "%s holds the 2 entries: %d", dir,
               cache_test_count_entries(dir));
}

/* SNEPPX_CACHE_MAX_MB and SNEPPX_CACHE_LOCK_TIMEOUT as read: good values
 * as given (a positive size below one byte as one byte), bad ones replaced by
 * the default with one warning naming the variable. */
static void test_settings(test_tally *tally)
{
    static const struct {
        const char *setting;
        unsigned long long max_bytes;
        double lock_timeout;
        int warnings;
    } cases[] = {
        {"SNEPPX_CACHE_MAX_MB", 1024ull << 20, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=0", 0, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=0.5", 512 << 10, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=1e-300", 1, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=0.0000001", 1, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=4.9e-324", 1, 30, 0},
        {"SNEPPX_CACHE_MAX_MB=-1", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_MAX_MB=1e300", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_MAX_MB=nan", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_MAX_MB=12MB", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=0", 1024ull << 20, 0, 0},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=0.25", 1024ull << 20, 0.25, 0},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=3600", 1024ull << 20, 3600, 0},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=-1", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=inf", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=nan", 1024ull << 20, 30, 1},
        {"SNEPPX_CACHE_LOCK_TIMEOUT=30s", 1024ull << 20, 30, 1},
    };
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, "settings");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* The other variable unset: each case sets one. */
        const char *other = strncmp(cases[i].setting, "SNEPPX_CACHE_MAX_MB", 19) == 0 ? "SNEPPX_CACHE_LOCK_TIMEOUT"
                                                                                       : "SNEPPX_CACHE_MAX_MB";
        const char *env[] = {env_dir, cases[i].setting, other, NULL};
        char *text = NULL;
        int code = cache_test_run_child("settings", env, &text);
        unsigned long long max_bytes = 0;
        double lock_timeout = -1;
        const char *line = text ? strstr(text, "max_bytes ") : NULL;
        int parsed = line && sscanf(line, "max_bytes %llu lock_timeout %lf", &max_bytes, &lock_timeout) == 2;
        char variable[64];
        snprintf(variable, sizeof variable, "warning: %.*s='", (int)strcspn(cases[i].setting, "="), cases[i].setting);
        TEST_CHECK(tally, code == 0 && parsed && max_bytes == cases[i].max_bytes &&
                              lock_timeout == cases[i].lock_timeout &&
                              cache_test_count(text, "warning:") == cases[i].warnings &&
                              (cases[i].warnings == 0 || strstr(text, variable)),
                   "%s: exit %d, max_bytes %llu lock_timeout %g (want %llu, %g, %d warnings naming it): %s",
                   cases[i].setting, code, max_bytes, lock_timeout, cases[i].max_bytes, cases[i].lock_timeout,
                   cases[i].warnings, text ? text : "");
        free(text);
    }
}

static void test_tiny_bound(test_tally *tally)
{
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX];
    path_in_base(dir, sizeof dir, "tiny-bound");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *env[] = {env_dir, "SNEPPX_CACHE_MAX_MB=1e-300", NULL};
    expect_child(tally, "SNEPPX_CACHE_MAX_MB=1e-300", "tiny-bound", env, 0, NULL);
}

static long long file_size(const char *dir, const int64_t *values)
{
    char key[SNEPPX_KEY_MAX], path[CACHE_TEST_PATH_MAX];
    struct stat info;
    sneppx_kernel_key("rmsnorm", values, sneppx_host_target(), key, sizeof key);
    if (cache_test_entry_path(dir, key, path, sizeof path) != 0 || stat(path, &info) != 0)
        return -1;
    return (long long)info.st_size;
}

static void test_eviction(test_tally *tally)
{
    char dir[CACHE_TEST_PATH_MAX], env_dir[CACHE_TEST_ENV_MAX], bound[64];
    path_in_base(dir, sizeof dir, "sizes");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *sizes_env[] = {env_dir, "SNEPPX_CACHE_MAX_MB", NULL};
    expect_child(tally, "compile three", "compile-three", sizes_env, 0, NULL);
    long long a = file_size(dir, first_values), b = file_size(dir, second_values), c = file_size(dir, third_values);
    TEST_CHECK(tally, a > 0 && b > 0 && c > 0, "entry sizes %lld %lld %lld", a, b, c);
    if (a <= 0 || b <= 0 || c <= 0)
        return;
    /* Room for A and C (or A and B) but not all three. */
    long long most = (a + c > a + b ? a + c : a + b) + (b < c ? b : c) / 2;
    snprintf(bound, sizeof bound, "SNEPPX_CACHE_MAX_MB=%.9f", (double)most / (1 << 20));
    path_in_base(dir, sizeof dir, "bounded");
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *evict_env[] = {env_dir, bound, NULL};
    expect_child(tally, "least recently used evicted", "evict", evict_env, 0, NULL);
}

int main(int argc, char **argv)
{
    if (argc == 2) {
        unsetenv("SNEPPX_VERBOSE"); /* the warnings counted are the ones every user sees */
        if (strcmp(argv[1], "resolve") == 0)
            return child_resolve();
        if (strcmp(argv[1], "jit-forbidden") == 0)
            return child_jit_forbidden();
        if (strcmp(argv[1], "compile-three") == 0)
            return child_compile_three();
        if (strcmp(argv[1], "evict") == 0)
            return child_evict();
        if (strcmp(argv[1], "stale-probe") == 0)
            return child_stale_probe();
        if (strcmp(argv[1], "tiny-bound") == 0)
            return child_tiny_bound();
        if (strcmp(argv[1], "settings") == 0)
            return child_settings();
        fprintf(stderr, "unknown scenario %s\n", argv[1]);
        return 2;
    }
    test_tally tally = {0};
    if (cache_test_make_dir(base, sizeof base, "dirs") != 0) {
        perror("test directory");
        return 1;
    }
    test_locations(&tally);
    test_refusals(&tally);
    test_jit_forbidden(&tally);
    test_stale_probe(&tally);
    test_settings(&tally);
    test_eviction(&tally);
    test_tiny_bound(&tally);
    cache_test_remove_tree(base);
    return test_finish(&tally);
}
