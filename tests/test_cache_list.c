/* `sneppx-cache list` prints each entry's last use (its mtime) as a local
 * date. An mtime beyond the calendar's years (tmpfs stores any 64-bit time;
 * a clock gone wrong, or anyone's touch, can set one) has no such date:
 * localtime() fails, and the listing prints the raw "@<seconds>" instead of
 * crashing.
 * 1. sneppx_disk_cache_format_time on ordinary and extreme times;
 * 2. the tool itself, on a tmpfs (a private mount namespace: root, or a
 *    user allowed to make one; skipped with a message otherwise) holding
 *    entries dated 2^62 and -2^62 seconds from the epoch. */
#include "test_cache_common.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mount.h>
#include <time.h>

#include "disk_cache.h"

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

static void test_tool(test_tally *tally)
{
    const char *binary_dir = getenv("SNEPPX_BINARY_DIR");
    char tool[CACHE_TEST_PATH_MAX], dir[CACHE_TEST_DIR_MAX];
    if (!binary_dir || snprintf(tool, sizeof tool, "%s/runtime/sneppx-cache", binary_dir) >= (int)sizeof tool ||
        access(tool, X_OK) != 0) {
        TEST_CHECK(tally, 0, "no sneppx-cache under $SNEPPX_BINARY_DIR (%s)", binary_dir ? binary_dir : "unset");
        return;
    }
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

int main(void)
{
    test_tally tally = {0};
    test_format(&tally);
    test_tool(&tally);
    return test_finish(&tally);
}
