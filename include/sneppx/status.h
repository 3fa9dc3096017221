/* sneppx — status codes and error messages.
 *
 * Every public call returns a sneppx_status. On failure, sneppx_last_error()
 * returns a message naming the offending argument (thread-local; valid until
 * the next sneppx call on the same thread). Nothing in sneppx aborts. */
#ifndef SNEPPX_STATUS_H
#define SNEPPX_STATUS_H

#include "sneppx/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sneppx_status {
    SNEPPX_OK = 0,
    SNEPPX_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad size, bad shape */
    SNEPPX_ERR_UNKNOWN_PRESET = 2,   /* name not in the architecture registry */
    SNEPPX_ERR_UNSUPPORTED = 3,      /* valid config this build cannot run */
    SNEPPX_ERR_OUT_OF_MEMORY = 4,
    SNEPPX_ERR_JIT = 5,              /* LLVM failed, or SNEPPX_JIT=0 with a cache miss */
    SNEPPX_ERR_IO = 6,               /* file missing or unreadable */
    SNEPPX_ERR_FORMAT = 7,           /* malformed file (safetensors, cache entry) */
    SNEPPX_ERR_COMM = 8              /* a sharded layer's transport (MPI) failed (shard.h) */
} sneppx_status;

/* Message of the last failed call on this thread ("" if none). */
SNEPPX_API const char *sneppx_last_error(void);

/* Short constant name of a status ("SNEPPX_ERR_INVALID_ARGUMENT"). */
SNEPPX_API const char *sneppx_status_name(sneppx_status status);

#ifdef __cplusplus
}
#endif
#endif
