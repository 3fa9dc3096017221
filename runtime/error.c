#include "error.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for a path as long as the system takes (PATH_MAX) and the reason after it: messages
 * lead with the file they are about, and a reason cut off says nothing. */
static _Thread_local char last_error[PATH_MAX + 1024];

sneppx_status sneppx_fail(sneppx_status status, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(last_error, sizeof last_error, format, ap);
    va_end(ap);
    sneppx_log(2, "error: %s", last_error);
    return status;
}

void sneppx_clear_error(void) { last_error[0] = '\0'; }

const char *sneppx_last_error(void) { return last_error; }

sneppx_clipped sneppx_clip_to(const char *text, size_t limit)
{
    sneppx_clipped out;
    limit = limit < SNEPPX_CLIP_BYTES ? limit : SNEPPX_CLIP_BYTES;
    size_t end = strnlen(text, limit + 1);
    const int cut = end > limit;
    if (cut) {
        end = limit;
        /* The first byte left out continues a character: drop that
         * character's bytes kept (continuations, then its lead byte). */
        if (((unsigned char)text[end] & 0xC0) == 0x80) {
            while (end > 0 && ((unsigned char)text[end - 1] & 0xC0) == 0x80)
                end--;
            if (end > 0 && ((unsigned char)text[end - 1] & 0xC0) == 0xC0)
                end--;
        }
    }
    /* A control character would let a file or an argument start a line of its own, or
     * send a terminal escape sequence, inside a message. */
    for (size_t i = 0; i < end; i++) {
        const unsigned char c = (unsigned char)text[i];
        out.text[i] = sneppx_is_control(c) ? '?' : (char)c;
    }
    snprintf(out.text + end, sizeof out.text - end, "%s", cut ? "..." : "");
    return out;
}

sneppx_clipped sneppx_clip(const char *text) { return sneppx_clip_to(text, SNEPPX_CLIP_BYTES); }

int sneppx_has_control(const char *text)
{
    for (; *text; text++)
        if (sneppx_is_control((unsigned char)*text))
            return 1;
    return 0;
}

const char *sneppx_status_name(sneppx_status status)
{
    switch (status) {
    case SNEPPX_OK: return "SNEPPX_OK";
    case SNEPPX_ERR_INVALID_ARGUMENT: return "SNEPPX_ERR_INVALID_ARGUMENT";
    case SNEPPX_ERR_UNKNOWN_PRESET: return "SNEPPX_ERR_UNKNOWN_PRESET";
    case SNEPPX_ERR_UNSUPPORTED: return "SNEPPX_ERR_UNSUPPORTED";
    case SNEPPX_ERR_OUT_OF_MEMORY: return "SNEPPX_ERR_OUT_OF_MEMORY";
    case SNEPPX_ERR_JIT: return "SNEPPX_ERR_JIT";
    case SNEPPX_ERR_IO: return "SNEPPX_ERR_IO";
    case SNEPPX_ERR_FORMAT: return "SNEPPX_ERR_FORMAT";
    case SNEPPX_ERR_COMM: return "SNEPPX_ERR_COMM";
    }
    return "SNEPPX_ERR_UNKNOWN";
}

/* SNEPPX_VERBOSE: a level of digits only (above 2 is 2); anything else is one warning
 * and level 0. A negative level would hide the warnings level 0 promises, and atoi
 * read "1x" as 1, "x" as 0 and an overflow as anything. Printed here, not through
 * sneppx_log, which would ask for the level being read. */
static int verbosity_level;

static void read_verbosity(void)
{
    const char *env = getenv("SNEPPX_VERBOSE");
    if (!env || !env[0])
        return;
    if (strspn(env, "0123456789") != strlen(env)) {
        fprintf(stderr, "sneppx: warning: SNEPPX_VERBOSE='%s' is not a level 0, 1 or 2; using 0\n",
                sneppx_clip(env).text);
        return;
    }
    const char *digits = env + strspn(env, "0");
    verbosity_level = strlen(digits) > 1 ? 2 : digits[0] ? digits[0] - '0' : 0;
    if (verbosity_level > 2)
        verbosity_level = 2;
}

int sneppx_verbosity(void)
{
    /* Once: the first logs of a process may come from several threads at once (each
     * failing call logs). */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_verbosity);
    return verbosity_level;
}

void sneppx_log(int level, const char *format, ...)
{
    if (sneppx_verbosity() < level)
        return;
    va_list ap;
    va_start(ap, format);
    fputs("sneppx: ", stderr);
    vfprintf(stderr, format, ap);
    fputc('\n', stderr);
    va_end(ap);
}
