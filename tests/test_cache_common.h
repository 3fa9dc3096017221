/* Helpers of the JIT and kernel cache tests (tests/test_cache*.c, tests/test_jit*.c):
 * private cache directories, running this test binary again as a child process
 * with another environment (the cache directory is resolved once per process),
 * and the tiny kernels that prove a resolved kernel computes the right thing. */
#ifndef SNEPPX_TEST_CACHE_COMMON_H
#define SNEPPX_TEST_CACHE_COMMON_H

/* posix_spawn, mkdtemp, nftw, realpath: include this header first. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels.h"
#include "sneppx/cache.h"
#include "test_util.h"

extern char **environ;

/* Sizes of paths made of a directory (at most PATH_MAX) and more. */
#define CACHE_TEST_DIR_MAX PATH_MAX
#define CACHE_TEST_PATH_MAX (PATH_MAX + SNEPPX_KEY_MAX + 64)
#define CACHE_TEST_ENV_MAX (CACHE_TEST_PATH_MAX + 64)

/* A fresh 0700 directory under $TMPDIR (or /tmp); path holds PATH_MAX bytes. */
static inline int cache_test_make_dir(char *path, size_t size, const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(path, size, "%s/sneppx-%s-XXXXXX", base && base[0] ? base : "/tmp", tag);
    return mkdtemp(path) ? 0 : -1;
}

static inline int cache_test_remove_one(const char *path, const struct stat *info, int type, struct FTW *walk)
{
    (void)info;
    (void)type;
    (void)walk;
    chmod(path, 0700); /* a test may have made it unwritable */
    return remove(path);
}

/* rm -rf path (the directories the tests made). */
static inline void cache_test_remove_tree(const char *path)
{
    chmod(path, 0700);
    nftw(path, cache_test_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The entry file of key in dir; -1 if it does not fit in size. */
static inline int cache_test_entry_path(const char *dir, const char *key, char *path, size_t size)
{
    return snprintf(path, size, "%s/%s.o", dir, key) < (int)size ? 0 : -1;
}

/* Runs this executable again as `self scenario` with the environment changed
 * by changes[] ("NAME=value" sets, "NAME" unsets; NULL-terminated). The
 * child's stdout and stderr go to a file whose text (malloc'd) lands in
 * *stderr_text.
 * Returns the child's exit code, or -1 if it could not run or died. */
static inline int cache_test_run_child(const char *scenario, const char *const *changes, char **stderr_text)
{
    char **env = NULL;
    size_t count = 0, capacity = 16;
    for (char **e = environ; *e; e++)
        capacity++;
    for (const char *const *c = changes; c && *c; c++)
        capacity++;
    env = calloc(capacity + 1, sizeof *env);
    if (!env)
        return -1;
    for (char **e = environ; *e; e++) {
        int changed = 0;
        for (const char *const *c = changes; c && *c; c++) {
            size_t name_length = strcspn(*c, "=");
            if (strncmp(*e, *c, name_length) == 0 && (*e)[name_length] == '=')
                changed = 1;
        }
        if (!changed)
            env[count++] = *e;
    }
    for (const char *const *c = changes; c && *c; c++)
        if (strchr(*c, '='))
            env[count++] = (char *)*c;

    char log_path[] = "/tmp/sneppx-child-stderr-XXXXXX";
    int log = mkstemp(log_path);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, log, 1);
    posix_spawn_file_actions_adddup2(&actions, log, 2);
    char self[4096];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    int code = -1;
    if (log >= 0 && length > 0) {
        self[length] = '\0';
        char *argv[] = {self, (char *)scenario, NULL};
        pid_t child;
        int status;
        if (posix_spawn(&child, self, &actions, NULL, argv, env) == 0 && waitpid(child, &status, 0) == child)
            code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    free(env);
    *stderr_text = NULL;
    if (log >= 0) {
        off_t size = lseek(log, 0, SEEK_END);
        char *text = malloc((size_t)(size > 0 ? size : 0) + 1);
        if (text && pread(log, text, (size_t)(size > 0 ? size : 0), 0) == (ssize_t)(size > 0 ? size : 0)) {
            text[size > 0 ? size : 0] = '\0';
            *stderr_text = text;
        } else {
            free(text);
        }
        close(log);
        unlink(log_path);
    }
    return code;
}

/* Number of cache entries (*.o) in dir (temporary files end in .o.tmp-*). */
static inline int cache_test_count_entries(const char *dir)
{
    DIR *stream = opendir(dir);
    int count = 0;
    for (struct dirent *item; stream && (item = readdir(stream)) != NULL;) {
        size_t length = strlen(item->d_name);
        count += length > 2 && strcmp(item->d_name + length - 2, ".o") == 0;
    }
    if (stream)
        closedir(stream);
    return count;
}

/* Occurrences of needle in text. */
static inline int cache_test_count(const char *text, const char *needle)
{
    int count = 0;
    for (const char *at = text; at && (at = strstr(at, needle)) != NULL; at += strlen(needle))
        count++;
    return count;
}

/* Runs the rmsnorm kernel (key field n) over 3 rows and returns the largest
 * error normalized by the largest reference value, against a float64 loop
 * (infinity if any output is not finite). Copies the first output row to
 * out_first_row unless it is NULL. */
static inline double cache_test_rmsnorm_error(const sneppx_kernel *kernel, int64_t n, float *out_first_row)
{
    enum { ROWS = 3 };
    float *src = malloc((size_t)(ROWS * n) * sizeof(float)), *dst = malloc((size_t)(ROWS * n) * sizeof(float));
    float *weight = malloc((size_t)n * sizeof(float));
    test_rng rng = test_rng_seeded(7);
    test_fill_uniform(&rng, src, ROWS * n, 2.0f);
    test_fill_uniform(&rng, weight, n, 1.0f);
    struct sneppx_args args = {.struct_size = sizeof args, .abi_version = SNEPPX_ABI_VERSION, .row_begin = 0,
                               .row_end = ROWS, .src = src, .src_stride = n, .weight = weight, .dst = dst,
                               .dst_stride = n, .eps = 1e-5f};
    kernel->entry[SNEPPX_ENTRY_RUN](&args);
    double worst = 0.0, largest = 0.0;
    for (int64_t r = 0; r < ROWS; r++) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += (double)src[r * n + i] * src[r * n + i];
        double inv_rms = 1.0 / sqrt(sum / (double)n + 1e-5);
        for (int64_t i = 0; i < n; i++) {
            double want = src[r * n + i] * inv_rms * weight[i];
            if (!isfinite(dst[r * n + i]))
                worst = INFINITY;
            worst = fmax(worst, fabs(want - dst[r * n + i]));
            largest = fmax(largest, fabs(want));
        }
    }
    if (out_first_row)
        memcpy(out_first_row, dst, (size_t)n * sizeof(float));
    free(src);
    free(dst);
    free(weight);
    return worst / largest;
}

#endif
