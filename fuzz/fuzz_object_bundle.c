/* Fuzzes the object bundle parser (runtime/object_bundle.c), which reads a
 * disk cache entry's payload before its objects reach the JIT linker.
 * Promises: an input is accepted or refused with SNEPPX_ERR_JIT and a message
 * naming the key; an accepted one has 1..SNEPPX_BUNDLE_MAX_OBJECTS non-empty
 * objects, in order, inside the input, and packing them again gives the input
 * byte for byte (the parser accepts exactly what the packer makes). */
#include <string.h>

#include "error.h"
#include "fuzz.h"
#include "object_bundle.h"
#include "sneppx/status.h"

static const char key[] = "fuzz-bundle-key";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly the input's length: reading past it is a sanitizer error. */
    uint8_t *input = malloc(size ? size : 1);
    FUZZ_ASSERT(input, "out of memory");
    memcpy(input, data, size);
    struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS];
    int count = -1;
    const sneppx_status status = sneppx_bundle_unpack(input, size, key, objects, &count);
    if (status != SNEPPX_OK) {
        FUZZ_ASSERT(status == SNEPPX_ERR_JIT, "refused with status %d", (int)status);
        FUZZ_ASSERT(strstr(sneppx_last_error(), key), "the refusal does not name the key: %s", sneppx_last_error());
        free(input);
        return 0;
    }
    FUZZ_ASSERT(count >= 1 && count <= SNEPPX_BUNDLE_MAX_OBJECTS, "count %d", count);
    const uint8_t *previous_end = input;
    for (int i = 0; i < count; i++) {
        const uint8_t *start = objects[i].data;
        FUZZ_ASSERT(objects[i].size > 0 && start >= previous_end && start <= input + size &&
                    objects[i].size <= (size_t)(input + size - start),
                    "object %d (%zu bytes at %td) is not inside the %zu-byte input after the one before", i,
                    objects[i].size, start - input, size);
        previous_end = start + objects[i].size;
    }
    void *again = NULL;
    size_t again_size = 0;
    FUZZ_ASSERT(sneppx_bundle_make(objects, count, &again, &again_size) == SNEPPX_OK, "repacking failed");
    FUZZ_ASSERT(again_size == size && memcmp(again, input, size) == 0,
                "an accepted %zu-byte bundle repacks to %zu other bytes", size, again_size);
    free(again);
    free(input);
    return 0;
}
