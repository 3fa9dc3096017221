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

/* Prints "sneppx: <message>" to stderr when verbosity >= level. */
void sneppx_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

#endif
