/* Child processes: the bench re-executes itself (fresh-process measurements)
 * and runs baselines, reading their results from stdout lines of the form
 * "name value..."; a server child answers one request line at a time, so that
 * its work can be timed in the same rounds as the bench's own. */
#ifndef SNEPPX_BENCH_CHILD_H
#define SNEPPX_BENCH_CHILD_H

#include <stddef.h>
#include <stdio.h>

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

/* A child that reads request lines on its stdin and answers each with one line. */
struct bench_server {
    int pid;         /* 0 when not running */
    FILE *requests;  /* the child's stdin */
    FILE *replies;   /* the child's stdout */
};

/* Starts argv[0] (a path) as bench_child_run does, with its stdin and stdout
 * connected to server. Returns 0, or -1 when it could not start. */
int bench_server_start(char *const argv[], const char *const *set_env, const char *const *unset_env,
                       struct bench_server *server);

/* The server's next line, without its newline, into line (size > 1). Returns 0,
 * or -1 at the end of its output (it exited) or for a line longer than size - 1. */
int bench_server_read_line(struct bench_server *server, char *line, size_t size);

/* Sends request (one line, without the newline) and reads the answer as
 * bench_server_read_line does. Returns 0, or -1 when the server has gone. */
int bench_server_ask(struct bench_server *server, const char *request, char *reply, size_t size);

/* Closes the server's stdin (its end of requests) and waits for it to exit.
 * Returns its exit status (128 + signal), 0 for a server not running. */
int bench_server_stop(struct bench_server *server);

/* Reads a server's start-up lines up to its "ready", passing each other line to
 * on_line (NULL: none). Returns 0; or -1, with why in `why`: its "unavailable
 * <reason>" line's reason (the server is left running; stop it), or that `name`
 * exited (with its status) before it was ready. */
int bench_server_await_ready(struct bench_server *server, const char *name,
                             void (*on_line)(const char *line, void *state), void *state, char *why,
                             size_t why_size);

/* The median seconds of a "ping" there and back: what each timed request of the
 * server carries beyond its own work. -1 when it did not answer "pong". */
double bench_server_round_trip(struct bench_server *server);

/* One request of a server whose answer starts with "done": the state of
 * bench_request_run, a bench_side body (timing.h). who names the server in the
 * message of a failed request. */
struct bench_request {
    struct bench_server *server;
    const char *who;
    char line[64];
};

/* Sends request->line and returns 0 when the answer is "done ...", else says
 * so on stderr (the answer, or that none came) and returns 1. */
int bench_request_run(void *request);

/* This executable, for re-executing itself. */
#define BENCH_SELF_EXE "/proc/self/exe"

#endif
