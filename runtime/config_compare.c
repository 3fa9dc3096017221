/* Two configs compared value by value through the rendered field table
 * (config_internal.h): padding and the bytes after a name's NUL never count,
 * and the first difference is named. */
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

/* An enum value by its name ("float32", "llama3"), or its number if it has none. */
static const char *enum_name(enum sneppx_field_kind kind, int value, char number[16])
{
    const char *name = NULL;
    if (kind == SNEPPX_FIELD_DTYPE)
        name = sneppx_dtype_name(value);
    else if (kind == SNEPPX_FIELD_ROPE_TYPE && value >= 0 && value < sneppx_rope_type_count)
        name = sneppx_rope_type_names[value];
    if (name)
        return name;
    snprintf(number, 16, "%d", value);
    return number;
}

static int skipped(size_t offset, const size_t *skip, int skip_count)
{
    for (int i = 0; i < skip_count; i++)
        if (skip[i] == offset)
            return 1;
    return 0;
}

int sneppx_config_difference(const sneppx_config *a, const sneppx_config *b, const size_t *skip, int skip_count,
                             char *text, size_t size)
{
    for (int i = 0; i < sneppx_config_field_count; i++) {
        const struct sneppx_config_field *f = &sneppx_config_fields[i];
        if (skipped(f->offset, skip, skip_count))
            continue;
        const char *pa = (const char *)a + f->offset, *pb = (const char *)b + f->offset;
        switch (f->kind) {
        case SNEPPX_FIELD_INT:
        case SNEPPX_FIELD_ROPE_TYPE:
        case SNEPPX_FIELD_DTYPE: {
            int va, vb;
            memcpy(&va, pa, sizeof va), memcpy(&vb, pb, sizeof vb);
            if (va == vb)
                continue;
            char na[16], nb[16];
            snprintf(text, size, "%s %s / %s", f->name, enum_name(f->kind, va, na), enum_name(f->kind, vb, nb));
            return 1;
        }
        case SNEPPX_FIELD_INT64: {
            int64_t va, vb;
            memcpy(&va, pa, sizeof va), memcpy(&vb, pb, sizeof vb);
            if (va == vb)
                continue;
            snprintf(text, size, "%s %lld / %lld", f->name, (long long)va, (long long)vb);
            return 1;
        }
        case SNEPPX_FIELD_DOUBLE: {
            /* Bitwise: a config is the same model only if every number is. */
            if (memcmp(pa, pb, sizeof(double)) == 0)
                continue;
            double va, vb;
            memcpy(&va, pa, sizeof va), memcpy(&vb, pb, sizeof vb);
            snprintf(text, size, "%s %.17g / %.17g", f->name, va, vb);
            return 1;
        }
        case SNEPPX_FIELD_NAME:
            if (strncmp(pa, pb, SNEPPX_NAME_MAX) == 0)
                continue;
            snprintf(text, size, "%s '%.*s' / '%.*s'", f->name, SNEPPX_NAME_MAX, pa, SNEPPX_NAME_MAX, pb);
            return 1;
        }
    }
    return 0;
}
