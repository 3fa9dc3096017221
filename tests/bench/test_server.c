/* The bench's server children (bench/child.c), with /bin/sh as the server: a
 * request gets its one-line answer, start-up lines are read before requests,
 * a server that has exited fails a request (the bench goes on: no SIGPIPE) and
 * its exit status is what stopping it returns. */
#include <stdio.h>
#include <string.h>

#include "child.h"

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static int start_shell(struct bench_server *server, const char *script, const char *const *set_env)
{
    char *const argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    return bench_server_start(argv, set_env, NULL, server);
}

int main(void)
{
    struct bench_server echo, other, gone;
    char line[64];
    const char *const set_env[] = {"SERVER_GREETING=ready", NULL};
    check(start_shell(&echo, "echo \"$SERVER_GREETING\"; while read -r line; do echo \"got $line\"; done; exit 4",
                      set_env) == 0,
          "a shell starts as a server");
    check(start_shell(&other, "while read -r line; do echo \"other $line\"; done", NULL) == 0,
          "a second server starts beside the first");
    check(bench_server_read_line(&echo, line, sizeof line) == 0 && strcmp(line, "ready") == 0,
          "the start-up line comes first, in the environment the server was given");
    check(bench_server_ask(&echo, "run 512", line, sizeof line) == 0 && strcmp(line, "got run 512") == 0,
          "a request gets its answer, without the newline");
    check(bench_server_ask(&other, "ping", line, sizeof line) == 0 && strcmp(line, "other ping") == 0,
          "the second server answers its own requests");
    check(bench_server_ask(&echo, "a request whose answer is longer than the buffer", line, 16) == -1,
          "an answer longer than the buffer is refused, not cut");
    /* The first server's end of input closes only if the second does not hold it open too. */
    check(bench_server_stop(&echo) == 4, "stopping a server ends its input and returns its exit status");
    check(bench_server_stop(&other) == 0, "the second server exits when its input ends");
    check(bench_server_stop(&other) == 0, "stopping a stopped server does nothing");

    check(start_shell(&gone, "exit 3", NULL) == 0, "a server that exits at once starts");
    check(bench_server_read_line(&gone, line, sizeof line) == -1, "its output ends without a line");
    check(bench_server_ask(&gone, "run 1", line, sizeof line) == -1, "a request to it fails and the bench goes on");
    check(bench_server_stop(&gone) == 3, "its exit status is kept");

    if (failures)
        return 1;
    printf("bench servers: all checks passed\n");
    return 0;
}
