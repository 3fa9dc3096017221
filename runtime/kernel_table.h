/* Internal: the tables rendered at build time by `sneppx-gen build` from
 * gen/sneppx_gen/kernels.py (key format, embedded bitcode) and gen/archs.json. */
#ifndef SNEPPX_RUNTIME_KERNEL_TABLE_H
#define SNEPPX_RUNTIME_KERNEL_TABLE_H
#include <stddef.h>
#include <stdint.h>
#include "sneppx/config.h"

#define SNEPPX_MAX_KEY_FIELDS 8
#define SNEPPX_MAX_ENTRIES 2

struct sneppx_kernel_family {
    const char *family;                                 /* "attn_flash" */
    int field_count;
    const char *field_names[SNEPPX_MAX_KEY_FIELDS];     /* global spec_<name> in the bitcode */
    const char *field_prefixes[SNEPPX_MAX_KEY_FIELDS];  /* "d", "dv", ... */
    const char *const *field_choices[SNEPPX_MAX_KEY_FIELDS]; /* NULL or names by value */
    int field_choice_count[SNEPPX_MAX_KEY_FIELDS];
    int entry_count;
    const char *entry_suffixes[SNEPPX_MAX_ENTRIES];     /* "" and "_pack" */
};

struct sneppx_embedded_bitcode {
    const char *family;
    int vector_width;
    const unsigned char *data;
    size_t size;
    const char *sha256_hex;   /* of data; part of every cache fingerprint */
};

/* The values a numeric key field may take (runtime/kernel_cache.c): what a
 * valid config can make the runtime ask for, so a key outside is a bug or
 * hand-written (sneppx-ir) and is refused before any IR is built. The table
 * is hand-written beside the generated one; a field it lacks is refused. */
struct sneppx_key_field_range {
    const char *family, *field;
    int64_t min, max;
    int64_t multiple;   /* the value is a multiple of it */
};

extern const struct sneppx_key_field_range sneppx_key_field_ranges[];
extern const int sneppx_key_field_range_count;

struct sneppx_kernel_family;
/* OK if value is legal for field `field` of the family (a choice index, or
 * within its range); else SNEPPX_ERR_INVALID_ARGUMENT naming the field.
 * sneppx_kernel_key (so every resolve) and sneppx-ir check each value here. */
sneppx_status sneppx_kernel_check_value(const struct sneppx_kernel_family *kind, int field, int64_t value);

extern const struct sneppx_kernel_family sneppx_kernel_families[];
extern const int sneppx_kernel_family_count;
extern const struct sneppx_embedded_bitcode sneppx_embedded_bitcodes[];
extern const int sneppx_embedded_bitcode_count;

struct sneppx_preset {
    const char *name;            /* CLI name, "llama3-8B" */
    const char *family;          /* "llama3" */
    const char *size;            /* "8B" */
    const char *const *aliases;  /* NULL-terminated extra names */
    sneppx_config config;
};

extern const struct sneppx_preset sneppx_presets[];
extern const int sneppx_presets_count;

#endif
