#include "error.h"

#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
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

int sneppx_verbosity(void)
{
    /* Atomic: the first logs of a process may come from several threads at once (each
     * failing call logs), and threads racing here all store the same value. */
    static atomic_int level = -1;
    int value = atomic_load_explicit(&level, memory_order_relaxed);
    if (value < 0) {
        const char *env = getenv("SNEPPX_VERBOSE");
        value = env ? atoi(env) : 0;
        atomic_store_explicit(&level, value, memory_order_relaxed);
    }
    return value;
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
