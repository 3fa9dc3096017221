/* Internal: recording errors. Every failing path sets a message that names the argument. */
#ifndef SNEPPX_RUNTIME_ERROR_H
#define SNEPPX_RUNTIME_ERROR_H
#include <stddef.h>
#include "sneppx/status.h"

/* Records status and a printf-style message as this thread's last error; returns status. */
sneppx_status sneppx_fail(sneppx_status status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears this thread's last error (start of every public call). */
void sneppx_clear_error(void);

/* Verbosity from SNEPPX_VERBOSE (0 warnings only, 1 also compiles, 2 everything). */
int sneppx_verbosity(void);

/* Outside text (a name, an argument, an environment value, a string of a
 * file) for a message: its first SNEPPX_CLIP_BYTES bytes at most, ending on a
 * whole UTF-8 character, then "..." when it was longer (a cut name must not
 * read as the whole name); each ASCII control character (0x01-0x1F, 0x7F)
 * becomes '?'. The array lives until the end of the full expression holding
 * the call, so sneppx_clip(name).text can be a printf argument.
 * gen/sneppx_gen/echo.py says the same for sneppx-gen's messages. */
#define SNEPPX_CLIP_BYTES 64
typedef struct sneppx_clipped {
    char text[SNEPPX_CLIP_BYTES + 4];
} sneppx_clipped;
sneppx_clipped sneppx_clip(const char *text);
/* The same, at most limit (<= SNEPPX_CLIP_BYTES) bytes. */
sneppx_clipped sneppx_clip_to(const char *text, size_t limit);

/* An ASCII control character, which sneppx_clip replaces. */
static inline int sneppx_is_control(unsigned char c) { return c < 0x20 || c == 0x7F; }

/* Whether text holds one: names that later messages echo whole (a tensor's) are refused so. */
int sneppx_has_control(const char *text);

/* Prints "sneppx: <message>" to stderr when verbosity >= level. */
void sneppx_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

#endif
