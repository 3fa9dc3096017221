/* Child processes with a changed environment and captured stdout. */
#include "child.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "timing.h"

static void change_environment(const char *const *set_env, const char *const *unset_env)
{
    for (const char *const *name = unset_env; name && *name; name++)
        unsetenv(*name);
    for (const char *const *entry = set_env; entry && *entry; entry++) {
        const char *equals = strchr(*entry, '=');
        if (!equals)
            continue;
        char name[256];
        const size_t len = (size_t)(equals - *entry) < sizeof name - 1 ? (size_t)(equals - *entry) : sizeof name - 1;
        memcpy(name, *entry, len);
        name[len] = '\0';
        setenv(name, equals + 1, 1);
    }
}

static char *read_all(int fd)
{
    size_t size = 0, capacity = 4096;
    char *text = malloc(capacity);
    if (!text)
        return NULL;
    for (;;) {
        if (size + 1 == capacity) {
            char *grown = realloc(text, capacity * 2);
            if (!grown)
                break; /* keep what was read; the child's exit status still tells */
            text = grown;
            capacity *= 2;
        }
        const ssize_t got = read(fd, text + size, capacity - size - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size += (size_t)got;
    }
    text[size] = '\0';
    return text;
}

int bench_child_run(char *const argv[], const char *const *set_env, const char *const *unset_env,
                    struct bench_child *child)
{
    memset(child, 0, sizeof *child);
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    const double start = bench_now();
    const pid_t pid = fork();
    if (pid < 0) {
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(pipe_fds[0]);
        if (dup2(pipe_fds[1], STDOUT_FILENO) < 0)
            _exit(127);
        close(pipe_fds[1]);
        change_environment(set_env, unset_env);
        execv(argv[0], argv);
        fprintf(stderr, "sneppx-bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pipe_fds[1]);
    child->output = read_all(pipe_fds[0]);
    close(pipe_fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    child->wall_seconds = bench_now() - start;
    child->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!child->output)
        child->output = calloc(1, 1);
    return child->output ? 0 : -1;
}

const char *bench_child_field(const char *output, const char *name)
{
    const size_t len = strlen(name);
    for (const char *line = output; line && *line;) {
        if (strncmp(line, name, len) == 0 && line[len] == ' ')
            return line + len + 1;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return NULL;
}
