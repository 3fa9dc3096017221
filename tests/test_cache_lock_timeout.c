/* A process stopped (SIGSTOP, a debugger, a frozen container) while it holds
 * a key's build lock keeps that lock: the kernel drops a flock only when the
 * process dies. Another process that needs the key waits at most
 * SNEPPX_CACHE_LOCK_TIMEOUT seconds, then builds it without the lock, with
 * one warning naming the key and the wait, and stores it (temporary file and
 * rename, as always); a third process then loads it from disk at once.
 *
 * The holder is this binary run as `hold`, stopped by its own SIGSTOP once
 * it holds the lock; the others run as `resolve`, with an alarm so that a
 * wait without bound fails the test instead of hanging it. */
#include "test_cache_common.h"

#include <errno.h>
#include <signal.h>
#include <time.h>

#include "disk_cache.h"

static const int64_t norm_n[] = {144};
enum { ALARM_SECONDS = 30 }; /* far above a compile, even under ASan */

/* ---- children ------------------------------------------------------------------ */

/* Takes the key's lock, says so on stdout, and stops. */
static int child_hold(void)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_kernel_key("rmsnorm", norm_n, sneppx_host_target(), key, sizeof key);
    int lock = sneppx_disk_cache_lock(key);
    printf("%s %d\n", lock >= 0 ? "held" : "not-held", lock);
    fflush(stdout);
    raise(SIGSTOP);
    pause(); /* until the parent's SIGKILL */
    return 0;
}

/* Resolves the key; prints where it came from and how long it took. */
static int child_resolve(void)
{
    alarm(ALARM_SECONDS);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    const sneppx_kernel *kernel = NULL;
    sneppx_status status = sneppx_kernel_resolve("rmsnorm", norm_n, sneppx_host_target(), &kernel);
    clock_gettime(CLOCK_MONOTONIC, &end);
    sneppx_kernel_timing timing;
    sneppx_kernel_last_timing(&timing);
    sneppx_jit_stats stats;
    sneppx_jit_stats_get(&stats);
    const double error = kernel ? cache_test_rmsnorm_error(kernel, norm_n[0], NULL) : INFINITY;
    printf("source %d seconds %.3f writes %llu error %.3g status %s %s\n", (int)timing.source,
           (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) * 1e-9,
           (unsigned long long)stats.disk_writes, error, sneppx_status_name(status), sneppx_last_error());
    return status == SNEPPX_OK && error < 1e-6 ? 0 : 1;
}

/* ---- the parent ----------------------------------------------------------------- */

/* Starts `self hold` with its stdout on a pipe; *out is the pipe's read end. */
static pid_t spawn_holder(int *out)
{
    int pipe_fds[2];
    char self[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    if (length <= 0 || pipe(pipe_fds) != 0)
        return -1;
    self[length] = '\0';
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    char *argv[] = {self, "hold", NULL};
    pid_t child = -1;
    if (posix_spawn(&child, self, &actions, NULL, argv, environ) != 0)
        child = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    *out = pipe_fds[0];
    return child;
}

struct resolved {
    int code, source;
    double seconds;
    unsigned long long writes;
    char *output;
};

static struct resolved run_resolve(const char *const *env)
{
    struct resolved result = {.source = -1, .seconds = -1};
    result.code = cache_test_run_child("resolve", env, &result.output);
    const char *line = result.output ? strstr(result.output, "source ") : NULL;
    if (!line || sscanf(line, "source %d seconds %lf writes %llu", &result.source, &result.seconds,
                        &result.writes) != 3)
        result.code = result.code ? result.code : -2;
    return result;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "hold") == 0)
        return child_hold();
    if (argc == 2 && strcmp(argv[1], "resolve") == 0)
        return child_resolve();

    test_tally tally = {0};
    char dir[CACHE_TEST_DIR_MAX];
    if (cache_test_make_dir(dir, sizeof dir, "lock-timeout") != 0 || setenv("SNEPPX_CACHE_DIR", dir, 1) != 0) {
        perror("cache directory");
        return 1;
    }
    unsetenv("SNEPPX_JIT");
    unsetenv("SNEPPX_VERBOSE"); /* the warnings counted are the ones every user sees */
    unsetenv("SNEPPX_CACHE_LOCK_TIMEOUT");
    char key[SNEPPX_KEY_MAX], quoted[SNEPPX_KEY_MAX + 16];
    sneppx_kernel_key("rmsnorm", norm_n, sneppx_host_target(), key, sizeof key);
    snprintf(quoted, sizeof quoted, "kernel '%s'", key);

    int holder_out = -1;
    pid_t holder = spawn_holder(&holder_out);
    char said[64] = "";
    FILE *stream = holder >= 0 ? fdopen(holder_out, "r") : NULL;
    if (!stream || !fgets(said, sizeof said, stream) || strncmp(said, "held ", 5) != 0) {
        TEST_CHECK(&tally, 0, "the holder did not take the lock of %s: '%s'", key, said);
    } else {
        int status = 0;
        const int stopped = waitpid(holder, &status, WUNTRACED) == holder && WIFSTOPPED(status);
        TEST_CHECK(&tally, stopped, "the holder is stopped while it holds the lock (status 0x%x)", status);

        /* A short timeout: the wait ends, the key is compiled and stored. */
        const char *short_env[] = {"SNEPPX_CACHE_LOCK_TIMEOUT=0.5", NULL};
        struct resolved first = run_resolve(short_env);
        TEST_CHECK(&tally, first.code == 0 && first.source == SNEPPX_KERNEL_SOURCE_COMPILED && first.writes == 1,
                   "beside a stopped holder: exit %d, source %d (want compiled), %llu writes (want 1): %s",
                   first.code, first.source, first.writes, first.output ? first.output : "");
        TEST_CHECK(&tally, first.seconds >= 0.5 && first.seconds < 0.5 + 20.0,
                   "it waited %.3f s: at least the 0.5 s timeout, and bounded (20 s allowed for the compile)",
                   first.seconds);
        TEST_CHECK(&tally, cache_test_count(first.output, "warning:") == 1 && strstr(first.output, quoted) &&
                               strstr(first.output, "0.5 s") && strstr(first.output, "SNEPPX_CACHE_LOCK_TIMEOUT"),
                   "one warning naming %s, the 0.5 s it waited and the variable: %s", quoted,
                   first.output ? first.output : "");
        free(first.output);

        /* The default timeout (30 s), the holder still stopped: the entry is
         * on disk, loaded before any lock is needed. */
        const char *default_env[] = {"SNEPPX_CACHE_LOCK_TIMEOUT", NULL};
        struct resolved second = run_resolve(default_env);
        TEST_CHECK(&tally, second.code == 0 && second.source == SNEPPX_KERNEL_SOURCE_DISK && second.seconds < 5.0 &&
                               cache_test_count(second.output, "warning:") == 0,
                   "the next process: exit %d, source %d (want disk) in %.3f s (want < 5, no wait), no warning: %s",
                   second.code, second.source, second.seconds, second.output ? second.output : "");
        free(second.output);
    }
    if (holder > 0) {
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
    }
    if (stream)
        fclose(stream);
    else if (holder_out >= 0)
        close(holder_out);
    cache_test_remove_tree(dir);
    return test_finish(&tally);
}
