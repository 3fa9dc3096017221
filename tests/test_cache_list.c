/* `sneppx-cache list` prints each entry's last use (its mtime) as a local
 * date. An mtime beyond the calendar's years (tmpfs stores any 64-bit time;
 * a clock gone wrong, or anyone's touch, can set one) has no such date:
 * localtime() fails, and the listing prints the raw "@<seconds>" instead of
 * crashing.
 * 1. sneppx_disk_cache_format_time on ordinary and extreme times;
 * 2. the tool itself, on a tmpfs (a private mount namespace: root, or a
 *    user allowed to make one; skipped with a message otherwise) holding
 *    entries dated 2^62 and -2^62 seconds from the epoch;
 * 3. a tuning record whose entry verifies (header, fingerprint, hash) but
 *    whose text names no candidate pair is refused by every load, so list
 *    must not call it ok nor show count it loadable, and says it is ignored
 *    (a record is not rebuilt); a record of candidates is ok. */
#include "test_cache_common.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mount.h>
#include <time.h>

#include "disk_cache.h"
#include "host.h"
#include "tuning_record.h"

enum { SKIP = 77 };

static void test_format(test_tally *tally)
{
    static const long long extremes[] = {INT64_MAX, INT64_MIN, 1LL << 62, -(1LL << 62)};
    char text[32], want[32];
    for (size_t i = 0; i < sizeof extremes / sizeof extremes[0]; i++) {
        sneppx_disk_cache_format_time((struct timespec){.tv_sec = (time_t)extremes[i]}, text, sizeof text);
        snprintf(want, sizeof want, "@%lld", extremes[i]);
        TEST_CHECK(tally, strcmp(text, want) == 0, "time %lld: '%s', want '%s'", extremes[i], text, want);
    }
    const time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(want, sizeof want, "%Y-%m-%d %H:%M:%S", &local);
    sneppx_disk_cache_format_time((struct timespec){.tv_sec = now}, text, sizeof text);
    TEST_CHECK(tally, strcmp(text, want) == 0, "now: '%s', want '%s'", text, want);
}

/* In a child: a tmpfs at dir in a private mount namespace, entries dated
 * past the calendar, then exec `sneppx-cache list` (its output on stdout). */
static void child_list_on_tmpfs(const char *dir, const char *tool)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("sneppx-test", dir, "tmpfs", 0, "mode=0700") != 0) {
        printf("no tmpfs mount here (%s)\n", strerror(errno));
        _exit(SKIP);
    }
    static const struct {
        const char *name;
        long long seconds;
    } planted[] = {{"rmsnorm-n64-v16.o", 1LL << 62}, {"rmsnorm-n80-v16.o", -(1LL << 62)}};
    for (size_t i = 0; i < sizeof planted / sizeof planted[0]; i++) {
        char path[CACHE_TEST_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, planted[i].name);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        struct timespec times[2] = {{.tv_sec = (time_t)planted[i].seconds}, {.tv_sec = (time_t)planted[i].seconds}};
        if (fd < 0 || write(fd, "sneppxK\n", 8) != 8 || futimens(fd, times) != 0) {
            printf("cannot plant %s: %s\n", path, strerror(errno));
            _exit(1);
        }
        struct stat info;
        if (fstat(fd, &info) != 0 || info.st_mtim.tv_sec != (time_t)planted[i].seconds) {
            printf("this tmpfs keeps no mtime of %lld\n", planted[i].seconds);
            _exit(SKIP);
        }
        close(fd);
    }
    setenv("SNEPPX_CACHE_DIR", dir, 1);
    execl(tool, tool, "list", (char *)NULL);
    printf("cannot run %s: %s\n", tool, strerror(errno));
    _exit(1);
}

/* The sneppx-cache of this build into tool; 0 when it is there. */
static int find_tool(test_tally *tally, char *tool, size_t size)
{
    const char *binary_dir = getenv("SNEPPX_BINARY_DIR");
    if (!binary_dir || snprintf(tool, size, "%s/runtime/sneppx-cache", binary_dir) >= (int)size ||
        access(tool, X_OK) != 0) {
        TEST_CHECK(tally, 0, "no sneppx-cache under $SNEPPX_BINARY_DIR (%s)", binary_dir ? binary_dir : "unset");
        return -1;
    }
    return 0;
}

static void test_tool(test_tally *tally)
{
    char tool[CACHE_TEST_PATH_MAX], dir[CACHE_TEST_DIR_MAX];
    if (find_tool(tally, tool, sizeof tool) != 0)
        return;
    if (cache_test_make_dir(dir, sizeof dir, "list") != 0) {
        TEST_CHECK(tally, 0, "mkdtemp: %s", strerror(errno));
        return;
    }
    char log_path[] = "/tmp/sneppx-list-log-XXXXXX";
    int log = mkstemp(log_path);
    unlink(log_path);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        dup2(log, 1);
        dup2(log, 2);
        child_list_on_tmpfs(dir, tool);
    }
    int status = 0;
    waitpid(child, &status, 0);
    char output[8192] = "";
    ssize_t got = pread(log, output, sizeof output - 1, 0);
    output[got > 0 ? got : 0] = '\0';
    close(log);
    rmdir(dir);
    if (WIFEXITED(status) && WEXITSTATUS(status) == SKIP) {
        fprintf(stderr, "sneppx-cache list on a tmpfs: skipped: %s", output);
        tally->skipped++;
        return;
    }
    TEST_CHECK(tally, WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "sneppx-cache list with mtimes past the calendar: status 0x%x (a signal: %d), output:\n%s", status,
               WIFSIGNALED(status) ? WTERMSIG(status) : 0, output);
    TEST_CHECK(tally, strstr(output, "rmsnorm-n64-v") && strstr(output, "@4611686018427387904") &&
                          strstr(output, "rmsnorm-n80-v") && strstr(output, "@-4611686018427387904"),
               "each entry listed with its raw time:\n%s", output);
}

/* The output of `tool command` (stdout and stderr) into output. */
static void run_tool(const char *tool, const char *command, char *output, size_t size)
{
    char line[CACHE_TEST_PATH_MAX + 64];
    snprintf(line, sizeof line, "'%s' %s 2>&1", tool, command);
    output[0] = '\0';
    FILE *pipe = popen(line, "r");
    size_t got = pipe ? fread(output, 1, size - 1, pipe) : 0;
    output[got] = '\0';
    if (pipe)
        pclose(pipe);
}

/* Stores text as the host target's tuning record, with this build's fingerprint. */
static void plant_record(test_tally *tally, const char *key, const char *text)
{
    uint8_t fingerprint[SNEPPX_SHA256_SIZE];
    int evicted = 0;
    TEST_CHECK(tally, sneppx_tuning_fingerprint(key, fingerprint) == SNEPPX_OK &&
                          sneppx_disk_cache_store(key, fingerprint, text, strlen(text), &evicted) == SNEPPX_OK,
               "planting %s: %s", key, sneppx_last_error());
}

static void test_record_verdicts(test_tally *tally)
{
    char tool[CACHE_TEST_PATH_MAX], dir[CACHE_TEST_DIR_MAX], key[SNEPPX_KEY_MAX], text[64], line[256];
    char output[8192];
    if (find_tool(tally, tool, sizeof tool) != 0)
        return;
    /* This process resolves its cache directory here, once: the tool is given the same. */
    if (cache_test_make_dir(dir, sizeof dir, "records") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        TEST_CHECK(tally, 0, "cache directory: %s", strerror(errno));
        return;
    }
    const struct sneppx_target *target = sneppx_host_target();
    sneppx_gemm_tuning_key(target, key, sizeof key);

    snprintf(text, sizeof text, "kc=100 mc=%d\n", target->gemm_mc_candidates[0]);
    plant_record(tally, key, text);
    run_tool(tool, "list", output, sizeof output);
    snprintf(line, sizeof line, "ignored on next use: kc 100 is not among target %s's candidates", target->name);
    TEST_CHECK(tally, strstr(output, key) && strstr(output, line) && !strstr(output, " ok"),
               "list of a record of kc 100: want '%s', got:\n%s", line, output);
    run_tool(tool, "show", output, sizeof output);
    TEST_CHECK(tally, strstr(output, "entries     1 (0 loadable by this build)") != NULL,
               "show of a record of kc 100 counts it not loadable:\n%s", output);

    snprintf(text, sizeof text, "kc=%d mc=%d\n", target->gemm_kc_candidates[0], target->gemm_mc_candidates[0]);
    plant_record(tally, key, text);
    run_tool(tool, "list", output, sizeof output);
    TEST_CHECK(tally, strstr(output, key) && strstr(output, " ok\n"), "list of a record of candidates: ok, got:\n%s",
               output);
    cache_test_remove_tree(dir);
}

int main(void)
{
    test_tally tally = {0};
    test_format(&tally);
    test_tool(&tally);
    test_record_verdicts(&tally);
    return test_finish(&tally);
}
