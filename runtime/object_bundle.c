/* The bundle (object_bundle.h): the magic, the object count, each object's
 * size (the unused slots zero), then the objects, each at an offset that is a
 * multiple of BUNDLE_ALIGN (ELF readers want their headers aligned), padded
 * with zeros. Unpacking accepts exactly what packing makes. Sizes are little
 * endian as the host writes them: the disk cache's fingerprint names the
 * host, so a bundle is only ever read where it was written. */
#include "object_bundle.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define BUNDLE_MAGIC "sneppxO\n"
#define BUNDLE_ALIGN 16

struct bundle_header {
    char magic[8];
    uint32_t count;
    uint32_t reserved; /* 0 */
    uint64_t sizes[SNEPPX_BUNDLE_MAX_OBJECTS];
};

/* The first object starts right after the header. */
_Static_assert(sizeof(struct bundle_header) % BUNDLE_ALIGN == 0, "the header is not a whole number of alignments");

static size_t aligned(size_t offset) { return (offset + BUNDLE_ALIGN - 1) & ~(size_t)(BUNDLE_ALIGN - 1); }

sneppx_status sneppx_bundle_make(const struct sneppx_object_span *objects, int count, void **bundle,
                                 size_t *bundle_size)
{
    if (count < 1 || count > SNEPPX_BUNDLE_MAX_OBJECTS)
        return sneppx_fail(SNEPPX_ERR_JIT, "an object bundle holds 1 to %d objects, not %d",
                           SNEPPX_BUNDLE_MAX_OBJECTS, count);
    struct bundle_header header = {.count = (uint32_t)count};
    memcpy(header.magic, BUNDLE_MAGIC, sizeof header.magic);
    size_t size = sizeof header;
    for (int i = 0; i < count; i++) {
        if (objects[i].size == 0 || objects[i].size > SIZE_MAX / 2 - size)
            return sneppx_fail(SNEPPX_ERR_JIT, "object %d of a bundle has %zu bytes", i, objects[i].size);
        header.sizes[i] = objects[i].size;
        size = aligned(size + objects[i].size);
    }
    unsigned char *out = calloc(1, size);
    if (!out)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "out of memory bundling %zu bytes of objects", size);
    memcpy(out, &header, sizeof header);
    size_t offset = sizeof header;
    for (int i = 0; i < count; i++) {
        memcpy(out + offset, objects[i].data, objects[i].size);
        offset = aligned(offset + objects[i].size);
    }
    *bundle = out;
    *bundle_size = size;
    return SNEPPX_OK;
}

sneppx_status sneppx_bundle_unpack(const void *bundle, size_t bundle_size, const char *key,
                                   struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS], int *count)
{
    struct bundle_header header;
    if (bundle_size < sizeof header)
        return sneppx_fail(SNEPPX_ERR_JIT, "the code of kernel '%s' is %zu bytes, shorter than an object bundle's "
                           "header", key, bundle_size);
    memcpy(&header, bundle, sizeof header);
    if (memcmp(header.magic, BUNDLE_MAGIC, sizeof header.magic) != 0 || header.reserved != 0 ||
        header.count < 1 || header.count > SNEPPX_BUNDLE_MAX_OBJECTS)
        return sneppx_fail(SNEPPX_ERR_JIT, "the code of kernel '%s' is not an object bundle (magic, count %u)",
                           key, header.count);
    for (uint32_t i = header.count; i < SNEPPX_BUNDLE_MAX_OBJECTS; i++)
        if (header.sizes[i] != 0)
            return sneppx_fail(SNEPPX_ERR_JIT, "the object bundle of kernel '%s' sizes an object past its count %u",
                               key, header.count);
    size_t offset = sizeof header;
    for (uint32_t i = 0; i < header.count; i++) {
        /* offset <= bundle_size holds here: checked below for every object before */
        if (header.sizes[i] == 0 || header.sizes[i] > bundle_size - offset)
            return sneppx_fail(SNEPPX_ERR_JIT, "object %u of kernel '%s' (%llu bytes) does not fit its bundle "
                               "(%zu bytes left)", i, key, (unsigned long long)header.sizes[i],
                               bundle_size - offset);
        objects[i].data = (const unsigned char *)bundle + offset;
        objects[i].size = (size_t)header.sizes[i];
        const size_t end = offset + objects[i].size;
        offset = aligned(end);
        if (offset > bundle_size)
            return sneppx_fail(SNEPPX_ERR_JIT, "object %u of kernel '%s' lacks its padding in the bundle", i, key);
        for (size_t pad = end; pad < offset; pad++)
            if (((const unsigned char *)bundle)[pad] != 0)
                return sneppx_fail(SNEPPX_ERR_JIT, "object %u of kernel '%s' is followed by padding that is not "
                                   "zero", i, key);
    }
    if (offset != bundle_size)
        return sneppx_fail(SNEPPX_ERR_JIT, "the object bundle of kernel '%s' has %zu bytes after its objects",
                           key, bundle_size - offset);
    *count = (int)header.count;
    return SNEPPX_OK;
}
