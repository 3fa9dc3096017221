/* Child processes with a changed environment and captured stdout. */
#include "child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

static int exit_code_of(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Forks argv[0] (a path) with its stdout on stdout_fd and, when stdin_fd >= 0, its
 * stdin on stdin_fd, in the bench's environment changed by set_env and unset_env.
 * The caller's pipes are close-on-exec, so the child keeps only these two (a
 * server must not hold another's pipes open). Returns the pid, or -1. */
static pid_t spawn(char *const argv[], const char *const *set_env, const char *const *unset_env, int stdin_fd,
                   int stdout_fd)
{
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        if ((stdin_fd >= 0 && dup2(stdin_fd, STDIN_FILENO) < 0) || dup2(stdout_fd, STDOUT_FILENO) < 0)
            _exit(127);
        change_environment(set_env, unset_env);
        execv(argv[0], argv);
        fprintf(stderr, "sneppx-bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

int bench_child_run(char *const argv[], const char *const *set_env, const char *const *unset_env,
                    struct bench_child *child)
{
    memset(child, 0, sizeof *child);
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0)
        return -1;
    const double start = bench_now();
    const pid_t pid = spawn(argv, set_env, unset_env, -1, pipe_fds[1]);
    close(pipe_fds[1]);
    if (pid < 0) {
        close(pipe_fds[0]);
        return -1;
    }
    child->output = read_all(pipe_fds[0]);
    close(pipe_fds[0]);
    child->exit_code = exit_code_of(pid);
    child->wall_seconds = bench_now() - start;
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

int bench_server_start(char *const argv[], const char *const *set_env, const char *const *unset_env,
                       struct bench_server *server)
{
    memset(server, 0, sizeof *server);
    /* A server that exits early must fail a request, not kill the bench. */
    signal(SIGPIPE, SIG_IGN);
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(from_child, O_CLOEXEC) != 0) {
        close(to_child[0]);
        close(to_child[1]);
        return -1;
    }
    const pid_t pid = spawn(argv, set_env, unset_env, to_child[0], from_child[1]);
    close(to_child[0]);
    close(from_child[1]);
    if (pid > 0) {
        server->pid = pid;
        server->requests = fdopen(to_child[1], "w");
        server->replies = fdopen(from_child[0], "r");
    }
    if (!server->requests || !server->replies) {
        if (!server->requests)
            close(to_child[1]);
        if (!server->replies)
            close(from_child[0]);
        bench_server_stop(server);
        return -1;
    }
    return 0;
}

int bench_server_read_line(struct bench_server *server, char *line, size_t size)
{
    if (!server->replies || !fgets(line, (int)size, server->replies))
        return -1;
    const size_t length = strlen(line);
    if (length == 0 || line[length - 1] != '\n')
        return -1;
    line[length - 1] = '\0';
    return 0;
}

int bench_server_ask(struct bench_server *server, const char *request, char *reply, size_t size)
{
    if (!server->requests || fprintf(server->requests, "%s\n", request) < 0 || fflush(server->requests) != 0)
        return -1;
    return bench_server_read_line(server, reply, size);
}

int bench_server_stop(struct bench_server *server)
{
    if (server->requests)
        fclose(server->requests);
    if (server->replies)
        fclose(server->replies);
    const int exit_code = server->pid > 0 ? exit_code_of(server->pid) : 0;
    memset(server, 0, sizeof *server);
    return exit_code;
}

int bench_server_await_ready(struct bench_server *server, const char *name,
                             void (*on_line)(const char *line, void *state), void *state, char *why,
                             size_t why_size)
{
    char line[512];
    while (bench_server_read_line(server, line, sizeof line) == 0) {
        if (strcmp(line, "ready") == 0)
            return 0;
        const char *unavailable = bench_child_field(line, "unavailable");
        if (unavailable) {
            snprintf(why, why_size, "%.200s", unavailable);
            return -1;
        }
        if (on_line)
            on_line(line, state);
    }
    snprintf(why, why_size, "%s exited with status %d before it was ready", name, bench_server_stop(server));
    return -1;
}

double bench_server_round_trip(struct bench_server *server)
{
    enum { PINGS = 31 };
    double seconds[PINGS];
    char reply[64];
    for (int i = 0; i < PINGS; i++) {
        const double start = bench_now();
        if (bench_server_ask(server, "ping", reply, sizeof reply) != 0 || strcmp(reply, "pong") != 0)
            return -1;
        seconds[i] = bench_now() - start;
    }
    struct bench_stats stats;
    bench_stats_of(seconds, PINGS, &stats);
    return stats.median;
}

int bench_request_run(void *opaque)
{
    const struct bench_request *request = opaque;
    char reply[256] = "";
    if (bench_server_ask(request->server, request->line, reply, sizeof reply) == 0 &&
        bench_child_field(reply, "done"))
        return 0;
    fprintf(stderr, "sneppx-bench: %s, '%s': %s\n", request->who, request->line, reply[0] ? reply : "no answer");
    return 1;
}
