/* Child processes: the bench re-executes itself (fresh-process measurements)
 * and runs the PyTorch baseline, reading their results from stdout lines of
 * the form "name value...". */
#ifndef SNEPPX_BENCH_CHILD_H
#define SNEPPX_BENCH_CHILD_H

struct bench_child {
    char *output;        /* the child's whole stdout, NUL-terminated (free it) */
    int exit_code;       /* exit status, or 128 + signal */
    double wall_seconds; /* fork to exit */
};

/* Runs argv[0] (a path) with argv, in the bench's environment changed by
 * set_env ("NAME=value" entries) and unset_env (names), both NULL-terminated
 * or NULL. stdout is captured, stderr goes to the bench's stderr.
 * Returns 0 when the child ran (see exit_code), -1 when it could not start. */
int bench_child_run(char *const argv[], const char *const *set_env, const char *const *unset_env,
                    struct bench_child *child);

/* The text after "name " on the first line of output that starts with it, or NULL. */
const char *bench_child_field(const char *output, const char *name);

/* This executable, for re-executing itself. */
#define BENCH_SELF_EXE "/proc/self/exe"

#endif
