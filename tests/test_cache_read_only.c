/* The locked-down deployment: a cache warmed by the service user, then made
 * read-only (directory 0500, entries 0400, no lock files; and, where this
 * process may make mounts, a read-only bind mount of it), used by that user
 * with SNEPPX_JIT=0. Every kernel loads from disk, with no warning, no
 * compile, and nothing written: no file created, removed, or re-dated (a
 * load does not mark the entry used), no lock file. With the JIT allowed, a
 * kernel missing from it is compiled and kept in memory, with one warning,
 * and still nothing is written; a clear fails and removes nothing.
 *
 * Permissions bind only other users than root, so as root (CI) each step
 * runs in a forked child that becomes `nobody` first; as another user, in a
 * forked child as that user. The parent makes no sneppx call: each child
 * resolves its cache (once per process) from its own environment. */
#include "test_cache_common.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>

#include "disk_cache.h"
#include "sneppx/sneppx.h"

enum { SKIP = 77 }; /* a child's exit code: this step cannot run here */

static char base[CACHE_TEST_DIR_MAX], dir[CACHE_TEST_PATH_MAX];
static uid_t service_uid;
static gid_t service_gid;

static void small_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = 128, c->num_attention_heads = 8, c->num_key_value_heads = 2, c->head_dim = 16;
    c->sliding_window = 5;
}

static const int64_t missing_norm_n[] = {80}; /* a key the warmed cache lacks */

/* ---- the service's steps (in a child, as the service user) ------------------ */

static int step_warm(void)
{
    test_tally tally = {0};
    sneppx_config config;
    small_config(&config);
    sneppx_status status = sneppx_layer_warmup(&config);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, status == SNEPPX_OK && stats.compiles > 0 && stats.disk_writes == stats.compiles,
               "warm: %s, %llu compiles, %llu writes: %s", sneppx_status_name(status),
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_writes, sneppx_last_error());
    return test_finish(&tally);
}

/* SNEPPX_JIT=0 on the read-only cache: every kernel of the layer from disk. */
static int step_load(void)
{
    test_tally tally = {0};
    const int entries = atoi(getenv("SNEPPX_TEST_ENTRIES"));
    TEST_CHECK(&tally, strcmp(sneppx_cache_dir(), dir) == 0 && sneppx_disk_cache_read_only(),
               "cache dir '%s' (want %s), read-only %d (want 1)", sneppx_cache_dir(), dir,
               sneppx_disk_cache_read_only());
    sneppx_config config;
    small_config(&config);
    sneppx_status status = sneppx_layer_warmup(&config); /* every kernel the warm step made */
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, status == SNEPPX_OK, "warmup on the read-only cache with SNEPPX_JIT=0: %s %s",
               sneppx_status_name(status), sneppx_last_error());
    TEST_CHECK(&tally, stats.compiles == 0 && stats.disk_hits == (uint64_t)entries && stats.disk_rejects == 0 &&
                           stats.disk_writes == 0 && stats.evictions == 0,
               "%llu compiles, %llu disk hits (want 0, %d), %llu rejects, %llu writes, %llu evictions",
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_hits, entries,
               (unsigned long long)stats.disk_rejects, (unsigned long long)stats.disk_writes,
               (unsigned long long)stats.evictions);
    sneppx_layer *layer = NULL;
    status = sneppx_layer_create(&config, NULL, &layer);
    TEST_CHECK(&tally, status == SNEPPX_OK, "a layer: %s %s", sneppx_status_name(status), sneppx_last_error());
    if (layer) {
        enum { SEQ = 3 };
        float x[SEQ * 128], y[SEQ * 128];
        test_rng rng = test_rng_seeded(5);
        test_fill_uniform(&rng, x, SEQ * 128, 1.0f);
        status = sneppx_layer_forward(layer, 1, SEQ, x, NULL, NULL, NULL, y);
        int finite = 1;
        for (int i = 0; i < SEQ * 128; i++)
            finite &= isfinite(y[i]) != 0;
        TEST_CHECK(&tally, status == SNEPPX_OK && finite, "forward with the loaded kernels: %s, finite %d",
                   sneppx_last_error(), finite);
        /* Generation over a KV cache of every element type: the warm step made its decode keys. */
        for (int dtype = 0; dtype < SNEPPX_DTYPE_COUNT; dtype++) {
            sneppx_kv_cache_options options;
            sneppx_kv_cache_options_init(&options);
            options.capacity_tokens = 64, options.dtype = (sneppx_dtype)dtype;
            sneppx_kv_cache *cache = NULL;
            int64_t seq = -1, prompt = SEQ, step = 1;
            status = sneppx_kv_cache_create(&config, &options, &cache);
            if (status == SNEPPX_OK)
                status = sneppx_kv_cache_add_sequence(cache, &seq);
            if (status == SNEPPX_OK)
                status = sneppx_layer_forward_cached(layer, cache, 0, 1, &seq, &prompt, x, NULL, NULL, y);
            if (status == SNEPPX_OK)
                status = sneppx_layer_forward_cached(layer, cache, 0, 1, &seq, &step, x, NULL, NULL, y);
            TEST_CHECK(&tally, status == SNEPPX_OK, "a prompt and a decode step over a %s cache: %s %s",
                       sneppx_dtype_name((sneppx_dtype)dtype), sneppx_status_name(status), sneppx_last_error());
            sneppx_kv_cache_destroy(cache);
        }
        sneppx_layer_destroy(layer);
    }
    status = sneppx_cache_clear();
    TEST_CHECK(&tally, status == SNEPPX_ERR_IO && strstr(sneppx_last_error(), "read-only") &&
                           strstr(sneppx_last_error(), "nothing removed"),
               "a clear of the read-only cache: %s '%s' (want SNEPPX_ERR_IO, read-only, nothing removed)",
               sneppx_status_name(status), sneppx_last_error());
    return test_finish(&tally);
}

/* The JIT allowed: a key missing from the read-only cache compiles, stays in memory. */
static int step_compile_missing(void)
{
    test_tally tally = {0};
    const sneppx_kernel *kernel = NULL;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", missing_norm_n, sneppx_host_target(), &kernel);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    TEST_CHECK(&tally, status == SNEPPX_OK && kernel && stats.compiles == 1 && stats.disk_writes == 0,
               "a missing key: %s, %llu compiles (want 1), %llu writes (want 0): %s", sneppx_status_name(status),
               (unsigned long long)stats.compiles, (unsigned long long)stats.disk_writes, sneppx_last_error());
    if (kernel)
        TEST_CHECK(&tally, cache_test_rmsnorm_error(kernel, missing_norm_n[0], NULL) < 1e-6,
                   "the memory-only kernel computes");
    return test_finish(&tally);
}

/* ---- running a step as the service user ------------------------------------- */

/* In the child: a private mount namespace with dir bound read-only onto itself. */
static int mount_read_only(void)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount(dir, dir, NULL, MS_BIND, NULL) != 0 ||
        mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
        fprintf(stderr, "no read-only bind mount here (%s): that case is skipped\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* In the child: become the service user (when root), keeping the process
 * dumpable so LeakSanitizer can still inspect it. */
static int become_service_user(void)
{
    if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setgid(service_gid) != 0 || setuid(service_uid) != 0)) {
        fprintf(stderr, "cannot become uid %u: %s\n", (unsigned)service_uid, strerror(errno));
        return -1;
    }
    prctl(PR_SET_DUMPABLE, 1);
    if (access(dir, X_OK) != 0 && errno == EACCES) {
        fprintf(stderr, "uid %u cannot reach %s (a parent directory is closed to it): the step is skipped\n",
                (unsigned)geteuid(), dir);
        return -1;
    }
    return 0;
}

/* Runs step in a forked child as the service user with the environment
 * changes ("NAME=value" sets, "NAME" unsets); its stdout and stderr land in
 * *output (malloc'd). Returns its exit code (SKIP: could not run here). */
static int run_step(int (*step)(void), const char *const *env, int read_only_mount, char **output)
{
    char log_path[] = "/tmp/sneppx-read-only-log-XXXXXX";
    int log = mkstemp(log_path);
    *output = NULL;
    if (log < 0)
        return -1;
    unlink(log_path);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        dup2(log, 1);
        dup2(log, 2);
        for (const char *const *change = env; *change; change++) {
            const char *equals = strchr(*change, '=');
            if (equals) {
                char name[64];
                snprintf(name, sizeof name, "%.*s", (int)(equals - *change), *change);
                setenv(name, equals + 1, 1);
            } else {
                unsetenv(*change);
            }
        }
        if ((read_only_mount && mount_read_only() != 0) || become_service_user() != 0) {
            fflush(NULL);
            _exit(SKIP);
        }
        const int code = step();
        fflush(NULL);
        exit(code);
    }
    int status = 0, code = -1;
    if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status))
        code = WEXITSTATUS(status);
    off_t size = lseek(log, 0, SEEK_END);
    char *text = malloc((size_t)(size > 0 ? size : 0) + 1);
    if (text) {
        ssize_t got = pread(log, text, (size_t)(size > 0 ? size : 0), 0);
        text[got > 0 ? got : 0] = '\0';
    }
    close(log);
    *output = text;
    return code;
}

/* ---- the parent's view of the directory ------------------------------------- */

/* Every name in dir with its size and modification time, one per line, sorted. */
static char *snapshot(void)
{
    struct dirent **names = NULL;
    int count = scandir(dir, &names, NULL, alphasort);
    size_t capacity = 64 + (size_t)(count > 0 ? count : 0) * (NAME_MAX + 64), used = 0;
    char *text = calloc(1, capacity);
    for (int i = 0; i < count; i++) {
        char path[CACHE_TEST_PATH_MAX + NAME_MAX + 2];
        struct stat info;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (text && lstat(path, &info) == 0)
            used += (size_t)snprintf(text + used, capacity - used, "%s %lld %lld.%09ld %o\n", names[i]->d_name,
                                     (long long)info.st_size, (long long)info.st_mtim.tv_sec, info.st_mtim.tv_nsec,
                                     (unsigned)(info.st_mode & 07777));
        free(names[i]);
    }
    free(names);
    return text;
}

/* Locks removed (a shipped cache need not have them), entries 0400, dir 0500. */
static int lock_down(int *entries)
{
    DIR *stream = opendir(dir);
    *entries = 0;
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;) {
        char path[CACHE_TEST_PATH_MAX + NAME_MAX + 2];
        size_t length = strlen(item->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, item->d_name);
        if (length > 5 && strcmp(item->d_name + length - 5, ".lock") == 0)
            unlink(path);
        else if (length > 2 && strcmp(item->d_name + length - 2, ".o") == 0 && chmod(path, 0400) == 0)
            (*entries)++;
    }
    if (stream)
        closedir(stream);
    return stream && chmod(dir, 0500) == 0 ? 0 : -1;
}

static void check_step(test_tally *tally, const char *what, int code, const char *output, int warnings,
                       const char *warning_text)
{
    TEST_CHECK(tally, code == 0, "%s: child exit %d, output:\n%s", what, code, output ? output : "");
    const int seen = cache_test_count(output, "warning:");
    TEST_CHECK(tally, seen == warnings && (!warning_text || (output && strstr(output, warning_text))),
               "%s: %d warnings (want %d%s%s), output:\n%s", what, seen, warnings, warning_text ? " naming " : "",
               warning_text ? warning_text : "", output ? output : "");
}

/* The read-only steps; mounted: with the read-only bind mount too. */
static void test_read_only(test_tally *tally, int entries, int mounted)
{
    const char *how = mounted ? "read-only bind mount" : "mode 0500";
    char env_dir[CACHE_TEST_ENV_MAX], env_entries[64], what[128];
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    snprintf(env_entries, sizeof env_entries, "SNEPPX_TEST_ENTRIES=%d", entries);
    char *before = snapshot(), *output = NULL, *after;

    const char *load_env[] = {env_dir, env_entries, "SNEPPX_JIT=0", "SNEPPX_VERBOSE", NULL};
    int code = run_step(step_load, load_env, mounted, &output);
    snprintf(what, sizeof what, "%s, SNEPPX_JIT=0", how);
    if (code == SKIP) {
        fprintf(stderr, "%s: skipped: %s", what, output ? output : "");
        tally->skipped++;
        free(output);
        free(before);
        return;
    }
    check_step(tally, what, code, output, 0, NULL);
    free(output);
    after = snapshot();
    TEST_CHECK(tally, before && after && strcmp(before, after) == 0,
               "%s: the directory is unchanged; before:\n%safter:\n%s", what, before, after);
    free(after);

    const char *compile_env[] = {env_dir, "SNEPPX_JIT", "SNEPPX_VERBOSE", NULL};
    code = run_step(step_compile_missing, compile_env, mounted, &output);
    snprintf(what, sizeof what, "%s, a missing key compiled", how);
    check_step(tally, what, code, output, 1, "is read-only");
    free(output);
    after = snapshot();
    TEST_CHECK(tally, before && after && strcmp(before, after) == 0,
               "%s: the directory is unchanged; before:\n%safter:\n%s", what, before, after);
    free(after);
    free(before);
}

int main(void)
{
    test_tally tally = {0};
    struct passwd *nobody = getpwnam("nobody");
    service_uid = geteuid() == 0 ? (nobody ? nobody->pw_uid : 65534) : geteuid();
    service_gid = geteuid() == 0 ? (nobody ? nobody->pw_gid : 65534) : getegid();
    if (cache_test_make_dir(base, sizeof base, "read-only") != 0 || chown(base, service_uid, service_gid) != 0) {
        perror("test directory");
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/cache", base);

    char env_dir[CACHE_TEST_ENV_MAX], *output = NULL;
    snprintf(env_dir, sizeof env_dir, "SNEPPX_CACHE_DIR=%s", dir);
    const char *warm_env[] = {env_dir, "SNEPPX_JIT", "SNEPPX_VERBOSE", "SNEPPX_CACHE_MAX_MB", NULL};
    int code = run_step(step_warm, warm_env, 0, &output);
    if (code == SKIP) {
        /* Only a closed parent of $TMPDIR stops it: say so, loudly. */
        fprintf(stderr, "SKIPPED: the service user cannot run here: %s", output ? output : "");
        tally.skipped++;
    } else {
        check_step(&tally, "warming as the service user", code, output, 0, NULL);
        int entries = 0;
        TEST_CHECK(&tally, lock_down(&entries) == 0 && entries > 0, "locking %s down: %d entries", dir, entries);
        test_read_only(&tally, entries, 0);
        if (geteuid() == 0)
            test_read_only(&tally, entries, 1);
    }
    free(output);
    cache_test_remove_tree(base);
    return test_finish(&tally);
}
