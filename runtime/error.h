/* Internal: recording errors. Every failing path sets a message that names the argument. */
#ifndef SNEPPX_RUNTIME_ERROR_H
#define SNEPPX_RUNTIME_ERROR_H
#include "sneppx/status.h"

/* Records status and a printf-style message as this thread's last error; returns status. */
sneppx_status sneppx_fail(sneppx_status status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears this thread's last error (start of every public call). */
void sneppx_clear_error(void);

/* Verbosity from SNEPPX_VERBOSE (0 quiet, 1 compiles and warnings, 2 everything). */
int sneppx_verbosity(void);

/* Outside text (a name, an argument, an environment value) for a message:
 * its first SNEPPX_CLIP_BYTES bytes at most, ending on a whole UTF-8
 * character, then "..." when it was longer (a cut name must not read as the
 * whole name). The array lives until the end of the full expression holding
 * the call, so sneppx_clip(name).text can be a printf argument. */
#define SNEPPX_CLIP_BYTES 64
typedef struct sneppx_clipped {
    char text[SNEPPX_CLIP_BYTES + 4];
} sneppx_clipped;
sneppx_clipped sneppx_clip(const char *text);

/* Prints "sneppx: <message>" to stderr when verbosity >= level. */
void sneppx_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

#endif
