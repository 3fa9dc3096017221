/* The libFuzzer entry points every harness in fuzz/ defines (or may define),
 * shared by libFuzzer and by replay_main.c, which runs a harness over files
 * as a ctest. A harness aborts (FUZZ_ASSERT) when the library breaks one of
 * its own promises; sanitizers catch the memory and UB errors. */
#ifndef SNEPPX_FUZZ_H
#define SNEPPX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A broken promise of the library: print it and abort, so libFuzzer saves the input. */
#define FUZZ_ASSERT(condition, ...)                                                 \
    do {                                                                            \
        if (!(condition)) {                                                         \
            fprintf(stderr, "%s:%d: broken promise: %s: ", __FILE__, __LINE__, #condition); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            abort();                                                                \
        }                                                                           \
    } while (0)

/* A private directory for a harness's files, named after `name` ("sneppx-fuzz-cache"):
 * under /dev/shm (memory: no disk write per input) when it is writable, else $TMPDIR,
 * else /tmp. 0 when made (dir holds its path), -1 otherwise. */
static inline int fuzz_private_dir(const char *name, char *dir, size_t size)
{
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(dir, size, "%s/%s-XXXXXX", tmp && tmp[0] ? tmp : "/tmp", name);
    return mkdtemp(dir) ? 0 : -1;
}

#endif
