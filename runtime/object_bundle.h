/* Internal: a kernel's code as the JIT hands it to the disk cache and back:
 * one or more relocatable objects in one byte string. A key whose code
 * generation ran on two threads has two objects; they link together, and a
 * cache hit links the same objects a miss compiled. */
#ifndef SNEPPX_RUNTIME_OBJECT_BUNDLE_H
#define SNEPPX_RUNTIME_OBJECT_BUNDLE_H
#include <stddef.h>
#include "sneppx/status.h"

#define SNEPPX_BUNDLE_MAX_OBJECTS 4

struct sneppx_object_span {
    const void *data;
    size_t size;
};

/* Packs count objects (1..SNEPPX_BUNDLE_MAX_OBJECTS, none empty) into
 * *bundle (malloc'd; the caller frees it). */
sneppx_status sneppx_bundle_make(const struct sneppx_object_span *objects, int count, void **bundle,
                                 size_t *bundle_size);

/* Finds the objects of a bundle: objects[] point into it, at offsets that are
 * multiples of 16 (a malloc'd bundle's objects are aligned as ELF readers
 * want, so they may be read in place). The bundle may come
 * from a file: every field is checked against its size, and anything
 * sneppx_bundle_make would not have made (a length, count, size, slot or
 * padding byte off) is refused with SNEPPX_ERR_JIT naming key. */
sneppx_status sneppx_bundle_unpack(const void *bundle, size_t bundle_size, const char *key,
                                   struct sneppx_object_span objects[SNEPPX_BUNDLE_MAX_OBJECTS], int *count);

#endif
